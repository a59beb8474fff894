#!/usr/bin/env bash
# Issue 30, session 19 (run 113): the GPU out-of-memory test after the forward-raised peak and a room of 0.6.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 500 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning -s tests/test_gpu_out_of_memory.py tests/test_budget_out_of_memory.py > $OUT/pytest-run113.full 2>&1)
grep -v DEBUG $OUT/pytest-run113.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -40 | tee $OUT/pytest-run113.txt
