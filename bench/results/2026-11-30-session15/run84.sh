#!/usr/bin/env bash
# Issue 30, session 15 (run 84): the whole GPU suite at 1e6887b (session 14's untested-on-GPU changes).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 560 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests > $OUT/pytest-all-run84.full 2>&1
grep -v DEBUG $OUT/pytest-all-run84.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run84.txt
