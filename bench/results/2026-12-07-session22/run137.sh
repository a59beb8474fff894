#!/usr/bin/env bash
# Issue 30, session 22 (run 137): the two steady out-of-memory GPU tests at the session's last code.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
(cd python && timeout 120 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py -k after_the_warm_up > $OUT/pytest-run137.full 2>&1)
grep -v DEBUG $OUT/pytest-run137.full | grep -E '^E |passed|failed|FAILED|^kept|^failed|runs again|runs on' | tail -40 | cut -c1-1500 | tee $OUT/pytest-run137.txt
