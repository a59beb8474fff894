#!/usr/bin/env bash
# Issue 30, session 21 (run 127): the block stitch diagnostic (diag127.py), then the whole GPU suite but the out-of-memory file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 110 python ../../diag127.py > $OUT/diag127.txt 2>&1)
tail -5 $OUT/diag127.txt
(cd python && timeout 460 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_whole_model.py tests --ignore=tests/test_gpu_out_of_memory.py > $OUT/pytest-all-run127.full 2>&1)
grep -v DEBUG $OUT/pytest-all-run127.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run127.txt
