#!/usr/bin/env bash
# Issue 30, session 15 (run 92): the budget, loop and whole-model tests at the session's last code.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 420 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_budget_loops.py tests/test_budget_wrappers.py tests/test_whole_model.py tests/test_training_loops.py tests/test_gpu_budget.py tests/test_gpu_loops.py > $OUT/run92.txt 2>&1
grep -v DEBUG $OUT/run92.txt | grep -E '^E |passed|failed|FAILED' | tail -12
