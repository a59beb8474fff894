#!/usr/bin/env bash
# Issue 30, session 11 (run 47): eager Llama at 0.8, layer and block units (attention and MLP blocks), measured re-runs.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 190 python -m actoffload.budget_bench --models llama-eager --fractions 0.8 --granularities layer,block --steps 6 --out $OUT > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -7
grep -h "warm-up" $OUT/plans-*.txt
