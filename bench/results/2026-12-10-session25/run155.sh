#!/usr/bin/env bash
# Issue 30, session 25 (run 155): the session's code (LongerBatches in C++, the race's growth fit); the whole suite but the out-of-memory file, then that file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 420 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run155.full 2>&1
grep -v DEBUG $OUT/pytest-all-run155.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | cut -c1-400 | tee $OUT/pytest-all-run155.txt
timeout 130 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run155-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run155-oom.full | grep -E '^E |passed|failed|FAILED' | tail -20 | cut -c1-300 | tee $OUT/pytest-run155-oom.txt
rm -f $OUT/*.full
