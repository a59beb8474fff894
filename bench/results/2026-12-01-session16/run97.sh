#!/usr/bin/env bash
# Issue 30, session 16 (run 97): the first-call hook only after the warm-up and never beside compiled units (run 96's whole-compiled failure); varying lengths at 0.95; the model, budget and loop tests.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=bench/results/2026-11-30-session15/varlen_budget.py
timeout 100 python $S 0.95 2048,1536,2560,1024,3072,2048 70 2>&1 | grep -v DEBUG > $OUT/varlen-budget-095-run97.txt
grep -E "^ *(2[6-9]|3[0-9]|4[0-9]) " $OUT/varlen-budget-095-run97.txt | cut -c1-100; tail -1 $OUT/varlen-budget-095-run97.txt
cd python && timeout 330 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_models.py tests/test_budget_lengths.py tests/test_budget_loops.py tests/test_budget_wrappers.py tests/test_gpu_budget.py tests/test_whole_model.py tests/test_training_loops.py tests/test_gpu_loops.py > $OUT/run97-tests.txt 2>&1
grep -v DEBUG $OUT/run97-tests.txt | grep -E '^E |passed|failed|FAILED' | tail -12
