#!/usr/bin/env bash
# Issue 30, session 21 (run 131): the out-of-memory GPU tests, then the whole GPU suite but that file, at this session's last code.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 130 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run131-oom.full 2>&1)
grep -v DEBUG $OUT/pytest-run131-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|profile iterations' | tail -30 | tee $OUT/pytest-run131-oom.txt
(cd python && timeout 390 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_whole_model.py tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run131.full 2>&1)
grep -v DEBUG $OUT/pytest-all-run131.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run131.txt
