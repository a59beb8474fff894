#!/usr/bin/env bash
# Issue 30, session 25 (run 153): LongerBatches in C++ (cbd967f); the budget's tests under torch 2.11 with the GPU budget tests, then the out-of-memory file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 300 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_budget_out_of_memory.py tests/test_budget_loops.py tests/test_joint_budget.py tests/test_gpu_budget.py > $OUT/pytest-run153-budget.full 2>&1
grep -v DEBUG $OUT/pytest-run153-budget.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | cut -c1-400 | tee $OUT/pytest-run153-budget.txt
timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run153-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run153-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|^failed' | sed 's/^failed: .*raised in/failed, raised in/' | tail -40 | cut -c1-300 | tee $OUT/pytest-run153-oom.txt
rm -f $OUT/*.full
