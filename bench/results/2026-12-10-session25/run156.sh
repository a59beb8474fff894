#!/usr/bin/env bash
# Issue 30, session 25 (run 156): run 155's whole suite ran past its 420 s limit (no summary); the budget's other test files at e547c76, each test's result as it goes.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 200 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_loops.py tests/test_budget_reruns.py tests/test_budget_wrappers.py tests/test_budget_windows.py tests/test_selective.py > $OUT/pytest-run156.full 2>&1
echo "rc $?" >> $OUT/pytest-run156.full
grep -E 'PASSED|FAILED|ERROR|SKIPPED|XFAIL' $OUT/pytest-run156.full | sed 's/ *\[ *[0-9]*%\]//' | awk '{print $NF}' | sort | uniq -c | tee $OUT/pytest-run156.txt
grep -E '^E |FAILED|passed|failed|^rc' $OUT/pytest-run156.full | tail -15 | cut -c1-300 | tee -a $OUT/pytest-run156.txt
rm -f $OUT/*.full
