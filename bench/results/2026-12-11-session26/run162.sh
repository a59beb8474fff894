#!/usr/bin/env bash
# Issue 30, session 26 (run 162): test_budget_lengths.py at HEAD under torch 2.11 (with the cap on rungs).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 240 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py > $OUT/pytest-run162.full 2>&1)
grep -v DEBUG $OUT/pytest-run162.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error|several_lengths' | tail -14 | cut -c1-300 | tee $OUT/pytest-run162.txt
rm -f $OUT/*.full
