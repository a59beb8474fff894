#!/usr/bin/env bash
# Issue 30, session 11 (run 45): the issue's Llama at 0.41 with the model's inputs dumped (profiles-llama.json).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
timeout 300 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.41 --steps 6 --out /tmp/b > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "with wrap\|__enter__" | tail -8; cp /tmp/b/* $OUT/ 2>/dev/null
grep -E "warm-up" $OUT/plans-llama*.txt
