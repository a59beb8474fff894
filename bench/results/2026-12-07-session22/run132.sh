#!/usr/bin/env bash
# Issue 30, session 22 (run 132): session 21's last code on a GPU: the out-of-memory tests, the whole suite, the watch's host cost.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run132-oom.full 2>&1)
grep -v DEBUG $OUT/pytest-run132-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|profile iterations' | tail -30 | tee $OUT/pytest-run132-oom.txt
python ../diag132.py 2>&1 | tee $OUT/diag132.txt
(cd python && timeout 390 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run132.full 2>&1)
grep -v DEBUG $OUT/pytest-all-run132.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run132.txt
