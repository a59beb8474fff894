#!/usr/bin/env bash
# Issue 30, session 22 (run 136): the out-of-memory GPU tests with the plan that held coming back for longer batches.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
(cd python && timeout 170 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run136-oom.full 2>&1)
grep -v DEBUG $OUT/pytest-run136-oom.full | grep -E '^E |passed|failed|FAILED|^kept|^failed|race steps skipped|profile iterations|runs again|runs on' | tail -40 | cut -c1-1500 | tee $OUT/pytest-run136-oom.txt
