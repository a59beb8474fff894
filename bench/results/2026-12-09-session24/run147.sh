#!/usr/bin/env bash
# Issue 30, session 24 (run 147): session 23's last commits on a GPU (9e7096b: the check's peak counter reset only at a step of the plan's length; 28c87e7: _apply makes the loop before it commits the plan): the GPU longer-batch test, then the whole suite but it and the out-of-memory file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py -k longer_than > $OUT/pytest-run147-longer.full 2>&1
grep -v DEBUG $OUT/pytest-run147-longer.full | grep -E '^E |passed|failed|FAILED|^budget|^\(' | cut -c1-200 | tail -40 | tee $OUT/pytest-run147-longer.txt
timeout 420 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --ignore=tests/test_gpu_out_of_memory.py -k "not longer_than" > $OUT/pytest-all-run147.full 2>&1
grep -v DEBUG $OUT/pytest-all-run147.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -30 | tee $OUT/pytest-all-run147.txt
