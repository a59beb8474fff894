#!/usr/bin/env bash
# Issue 30, session 12 (run 51): eager Llama at 0.8 and 0.6 with block units (attention and MLP blocks), times per unit kind.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 500 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6 --granularities block --steps 8 --out $OUT > $OUT/bench.txt 2>&1
echo "eager rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -9
grep -h "warm-up\|^unit\|^   [01] \|^predicted" $OUT/plans-*.txt
