#!/usr/bin/env bash
# Issue 30, session 15 (run 87): torchtune's usage on batches of varying length, before (eaec07d) and after the plan serves other lengths (HEAD).
cd "$(dirname "$0")"
G=$PWD
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
for which in snap_before snap; do
  cd $G/$which
  echo "== $which"
  PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build timeout 200 python $G/snap/bench/results/2026-11-30-session15/varlen.py 2048 2>&1 | grep -v DEBUG | tee $OUT/varlen-$which-run87.txt | tail -20
done
cd $G/snap/python
PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$G/snap/build timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_whole_model.py tests/test_training_loops.py > $OUT/run87-tests.txt 2>&1
grep -E '^E |passed|failed|FAILED' $OUT/run87-tests.txt | tail -8
