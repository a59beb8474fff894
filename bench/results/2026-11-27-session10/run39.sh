#!/usr/bin/env bash
# Issue 30, session 10 (run 39): eager Llama traces of the race's plans at 0.8 and 0.6.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import actoffload._common as c; c.ext()" 2>&1 | tail -1
for f in 0.8 0.6; do
  mkdir -p $OUT/f$f
  timeout 270 python bench/results/2026-11-27-session10/trace_eager.py $OUT/f$f $f 2>&1 | grep -v Warning | tail -40
done
