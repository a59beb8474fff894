#!/usr/bin/env bash
# Issue 30, session 23 (run 145): the race's loop for longer batches keyed by plan; the lengths tests under torch 2.11 and the GPU longer-batch test.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_gpu_budget.py -k "lengths or longer_than" > $OUT/pytest-run145.full 2>&1
grep -v DEBUG $OUT/pytest-run145.full | grep -E '^E |passed|failed|FAILED' | tail -20 | cut -c1-400 | tee $OUT/pytest-run145.txt
