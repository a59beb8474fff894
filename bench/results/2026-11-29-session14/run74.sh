#!/usr/bin/env bash
# Issue 30, session 14 (run 74): the whole GPU suite at the compiled-call commit.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 580 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests > $OUT/pytest-all-run74.full 2>&1
grep -v DEBUG $OUT/pytest-all-run74.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run74.txt
