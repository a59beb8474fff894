#!/usr/bin/env bash
# Issue 30, session 26 (run 158): the whole GPU suite at HEAD (the out-of-memory file last), pytest -v so a timeout still reports.
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
cd $S/python
PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 500 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests --deselect tests/test_gpu_out_of_memory.py > $OUT/pytest-run167.full 2>&1
echo "rc $?"
grep -v DEBUG $OUT/pytest-run167.full | grep -E '^E |passed|failed|FAILED|ERROR|^tests/.*Error' | tail -24 | cut -c1-400 | tee $OUT/pytest-run167.txt
grep -cE ' PASSED' $OUT/pytest-run167.full; grep -cE ' SKIPPED' $OUT/pytest-run167.full; tail -1 $OUT/pytest-run167.full | cut -c1-200
rm -f $OUT/*.full
