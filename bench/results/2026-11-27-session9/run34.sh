#!/usr/bin/env bash
# Issue 30, session 9 (run 34, inline): GPT-2 at HEAD on the H200.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 230 python -m actoffload.budget_bench --models gpt2 --fractions 0.8,0.6,0.45 --steps 8 --out $OUT > $OUT/bench.txt 2>&1
