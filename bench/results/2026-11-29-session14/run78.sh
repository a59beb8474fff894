#!/usr/bin/env bash
# Issue 30, session 14 (run 78): budget_bench, Llama h4096 x 4096 tokens, each layer compiled (steps long enough to time).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p $OUT/compiled-h4096
timeout 570 python -W ignore -m actoffload.budget_bench --models llama --hidden 4096 --seq 4096 --compile --fractions 0.6,0.41 --steps 8 --out $OUT/compiled-h4096 > $OUT/compiled-h4096/log.txt 2> $OUT/compiled-h4096/err.txt
echo rc $?
grep -v DEBUG $OUT/compiled-h4096/log.txt | tail -20
grep -h 'warm-up trials\|predicted step\|^##' $OUT/compiled-h4096/plans-llama.txt
