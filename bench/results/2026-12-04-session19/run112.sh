#!/usr/bin/env bash
# Issue 30, session 19 (run 112): the out-of-memory handling (ca431ac) on the GPU: the new GPU test, the CPU tests of it, and the budget files.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 500 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py tests/test_budget_out_of_memory.py tests/test_gpu_budget.py tests/test_joint_budget.py tests/test_budget_loops.py > $OUT/pytest-run112.full 2>&1)
grep -v DEBUG $OUT/pytest-run112.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -40 | tee $OUT/pytest-run112.txt
