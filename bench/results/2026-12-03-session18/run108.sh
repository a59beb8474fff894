#!/usr/bin/env bash
# Issue 30, session 18 (run 108): where the offloading trials' time goes on SDPA Llama h2048 x 4096 (run 107: ORRORORR measured 71.6 ms where the model said 55.9).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
for f in 0.45 0.8; do
  timeout 240 python -W ignore bench/results/2026-11-27-session10/trace_eager.py $OUT $f 2048 4096 32000 2.6875 sdpa > $OUT/log-$f.txt 2>&1
  tail -40 $OUT/log-$f.txt
done
