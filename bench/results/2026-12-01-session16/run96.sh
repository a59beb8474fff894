#!/usr/bin/env bash
# Issue 30, session 16 (run 96): a longer batch seen at the forward's first positional call runs the plan for its size in its own forward; varying lengths at 0.95 and 0.7; then the whole GPU suite (the context's enter and exit were reshaped).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=bench/results/2026-11-30-session15/varlen_budget.py
timeout 100 python $S 0.95 2048,1536,2560,1024,3072,2048 80 2>&1 | grep -v DEBUG > $OUT/varlen-budget-095-run96.txt
grep -E "^ *(3[4-9]|4[0-9]) " $OUT/varlen-budget-095-run96.txt | cut -c1-100; tail -1 $OUT/varlen-budget-095-run96.txt
timeout 90 python $S 0.7 2048,1536,2560,1024,3072,2048 70 2>&1 | grep -v DEBUG > $OUT/varlen-budget-070-run96.txt
grep -E "^ *(5[0-9]|6[0-9]) " $OUT/varlen-budget-070-run96.txt | cut -c1-100; tail -1 $OUT/varlen-budget-070-run96.txt
cd python && timeout 380 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests > $OUT/pytest-all-run96.full 2>&1
grep -v DEBUG $OUT/pytest-all-run96.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run96.txt
