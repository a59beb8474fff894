#!/usr/bin/env bash
# Issue 30, session 26 (run 163): varlen_budget.py on Llama h4096 (eager, 0.7, 90 steps) with HEAD and with e27f895 (before the plan per length).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
for which in snap snapb; do
  (cd $PWD/$which && PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build timeout 200 python $S/bench/results/2026-12-11-session26/varlen_budget.py 0.7 2048,1536,2560,1024,3072,2048 90 eager 4096 > $OUT/varlen-h4096-eager-0.7-$which-run163.txt 2>&1)
  echo "== $which"; grep -v "^no offload" $OUT/varlen-h4096-eager-0.7-$which-run163.txt | awk '$10 == "False" || /plan:|exponent|Error|error/' | cut -c1-150 | tail -8
done
