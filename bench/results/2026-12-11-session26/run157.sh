#!/usr/bin/env bash
# Issue 30, session 26 (run 157): a plan per length after the warm-up (each batch runs the shortest rung at or above it). The lengths and budget tests at HEAD, then varlen_budget.py (eager, 0.7, 96 steps) with HEAD and with e27f895 (before).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap B=$PWD/snapb
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 220 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_gpu_budget.py tests/test_budget_out_of_memory.py > $OUT/pytest-run157.full 2>&1)
grep -v DEBUG $OUT/pytest-run157.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -20 | cut -c1-400 | tee $OUT/pytest-run157.txt
grep -cE 'PASSED' $OUT/pytest-run157.full
for which in snap snapb; do
  (cd $PWD/$which && PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build timeout 150 python $S/bench/results/2026-12-11-session26/varlen_budget.py 0.7 2048,1536,2560,1024,3072,2048 96 eager > $OUT/varlen-eager-0.7-$which-run157.txt 2>&1)
  echo "== $which"; grep -v "^no offload" $OUT/varlen-eager-0.7-$which-run157.txt | awk '$10 == "False" || /plan:|exponent|Error|error/' | cut -c1-150 | tail -14
done
rm -f $OUT/*.full
