#!/usr/bin/env bash
# Issue 30, session 19 (run 117): the whole GPU suite after the out-of-memory work (OffloadOutOfMemoryError, the race drops plans that ran out, the failed forward lets its graph go).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 540 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_whole_model.py tests > $OUT/pytest-all-run117.full 2>&1)
grep -v DEBUG $OUT/pytest-all-run117.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run117.txt
