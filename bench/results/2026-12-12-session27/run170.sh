#!/usr/bin/env bash
# Issue 30, session 27 (run 170): the issue's headline, SDPA Llama h4096 x 8192 at 0.41, 16 timed steps (run 152: 8), at 268ee9e.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p $OUT/llama
timeout 420 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.41 --steps 16 --out $OUT/llama > $OUT/llama/bench.txt 2>&1
echo "llama rc $?" >> $OUT/llama/bench.txt
grep -v Warn $OUT/llama/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -8
rm -f $OUT/*/rows.json $OUT/*/profiles-*.json
