#!/usr/bin/env bash
# Issue 30, session 27 (run 169): shorter lengths an eighth apart (268ee9e). varlen_budget.py on Llama h4096 (eager, 0.7, 90 steps) with 1024 before 1536, then test_budget_lengths.py.
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
(cd $S && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 230 python $S/bench/results/2026-12-11-session26/varlen_budget.py 0.7 2048,1024,1536,2560,3072,2048 90 eager 4096 > $OUT/varlen-h4096-eager-0.7-run169.txt 2>&1)
grep -v "^no offload" $OUT/varlen-h4096-eager-0.7-run169.txt | awk '$10 == "False" || /plan:|exponent|Error|error/' | cut -c1-150 | tail -8
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py > $OUT/pytest-run169.full 2>&1)
grep -v DEBUG $OUT/pytest-run169.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -12 | cut -c1-300 | tee $OUT/pytest-run169.txt
rm -f $OUT/*.full
