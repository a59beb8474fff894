#!/usr/bin/env bash
# Issue 30, session 23 (run 146): the check's peak counter reset only at the first unit of a step of the plan's length (9e7096b): the GPU longer-batch test.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 130 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py -k longer_than > $OUT/pytest-run146.full 2>&1
grep -v DEBUG $OUT/pytest-run146.full | grep -E '^E |passed|failed|FAILED|^budget|^\(' | cut -c1-200 | tail -40 | tee $OUT/pytest-run146.txt
