#!/usr/bin/env bash
# Issue 30, session 16 (run 94): the whole GPU suite at 53393c5 (session 15's last code, f26e954).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 560 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests > $OUT/pytest-all-run94.full 2>&1
grep -v DEBUG $OUT/pytest-all-run94.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run94.txt
