#!/usr/bin/env bash
# Issue 30, session 23 (run 144): the whole GPU suite at the session's code (plans for longer batches checked, their growth fitted, plans keyed by schedule), then the out-of-memory file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 430 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run144.full 2>&1
grep -v DEBUG $OUT/pytest-all-run144.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run144.txt
timeout 100 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run144-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run144-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped' | tail -20 | cut -c1-600 | tee $OUT/pytest-run144-oom.txt
