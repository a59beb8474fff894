#!/usr/bin/env bash
# Issue 30, session 14 (run 76): budget_bench with each Llama layer compiled, re-runs and checkpointing now around the compiled call.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p $OUT/compiled
timeout 560 python -W ignore -m actoffload.budget_bench --models llama --compile --fractions 0.8,0.6,0.45,0.3 --steps 10 --out $OUT/compiled > $OUT/compiled/log.txt 2> $OUT/compiled/err.txt
echo rc $?
grep -v DEBUG $OUT/compiled/log.txt | tail -40
