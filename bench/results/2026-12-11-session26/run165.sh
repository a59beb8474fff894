#!/usr/bin/env bash
# Issue 30, session 26 (run 165): test_gpu_budget.py and test_gpu_out_of_memory.py at HEAD (shorter batches' plans, the cap on rungs).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 170 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py tests/test_gpu_out_of_memory.py > $OUT/pytest-run165.full 2>&1)
grep -v DEBUG $OUT/pytest-run165.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -12 | cut -c1-300 | tee $OUT/pytest-run165.txt
grep -c ' PASSED' $OUT/pytest-run165.full
rm -f $OUT/*.full
