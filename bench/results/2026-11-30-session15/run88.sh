#!/usr/bin/env bash
# Issue 30, session 15 (run 88): the budget on batches of varying length, and at one length; then the budget loop tests (BatchNorm's buffers).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 240 python bench/results/2026-11-30-session15/varlen_budget.py 0.5 2048,1536,2560,1024,3072,2048 54 2>&1 | grep -v DEBUG > $OUT/varlen-budget-run88.txt
tail -62 $OUT/varlen-budget-run88.txt
timeout 150 python bench/results/2026-11-30-session15/varlen_budget.py 0.5 2048 40 2>&1 | grep -v DEBUG > $OUT/fixed-budget-run88.txt
tail -8 $OUT/fixed-budget-run88.txt
cd python && timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_loops.py > $OUT/run88-tests.txt 2>&1
grep -E '^E |passed|failed|FAILED' $OUT/run88-tests.txt | tail -8
