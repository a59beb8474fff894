#!/usr/bin/env bash
# Issue 30, session 12 (run 54): the issue's second Llama target, SDPA h2048 x 4096 tokens, at 0.45 and 0.3, 12 timed steps.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 420 python -m actoffload.budget_bench --models llama --fractions 0.45,0.3 --steps 12 --out $OUT > $OUT/bench.txt 2>&1
echo "llama rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -9
grep -h "warm-up" $OUT/plans-*.txt
rm -f $OUT/rows.json
