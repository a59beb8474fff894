#!/usr/bin/env bash
# Issue 30, session 22 (run 135): the out-of-memory GPU tests after the fixes of runs 133-134, then the whole GPU suite.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run135-oom.full 2>&1)
grep -v DEBUG $OUT/pytest-run135-oom.full | grep -E '^E |passed|failed|FAILED|^kept|^failed|race steps skipped|profile iterations' | tail -40 | cut -c1-1500 | tee $OUT/pytest-run135-oom.txt
(cd python && timeout 400 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run135.full 2>&1)
grep -v DEBUG $OUT/pytest-all-run135.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run135.txt
