#!/usr/bin/env bash
# Issue 30, session 24 (run 149): a backward that raised ends its iteration once its graph is freed outside any backward (1ebc57e); the whole suite but the out-of-memory file, then that file (what is allocated before each failed step).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 420 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run149.full 2>&1
grep -v DEBUG $OUT/pytest-all-run149.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run149.txt
timeout 120 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run149-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run149-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|^failed' | tail -30 | cut -c1-400 | tee $OUT/pytest-run149-oom.txt
