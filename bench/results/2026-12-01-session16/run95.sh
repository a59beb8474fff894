#!/usr/bin/env bash
# Issue 30, session 16 (run 95): a longer batch after the warm-up is planned for (JointRace.for_length): varying lengths at budgets that fit the longest (0.95 of the 2048-token peak) and that do not (0.7); then the budget tests.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=bench/results/2026-11-30-session15/varlen_budget.py
timeout 200 python $S 0.95 2048,1536,2560,1024,3072,2048 110 2>&1 | grep -v DEBUG > $OUT/varlen-budget-095-run95.txt
tail -30 $OUT/varlen-budget-095-run95.txt
timeout 150 python $S 0.7 2048,1536,2560,1024,3072,2048 90 2>&1 | grep -v DEBUG > $OUT/varlen-budget-070-run95.txt
tail -14 $OUT/varlen-budget-070-run95.txt
cd python && timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_budget_loops.py tests/test_gpu_budget.py tests/test_whole_model.py > $OUT/run95-tests.txt 2>&1
grep -v DEBUG $OUT/run95-tests.txt | grep -E '^E |passed|failed|FAILED' | tail -8
