#!/usr/bin/env bash
# Issue 30, session 25 (run 154): a longer batch's race step fits the bytes' growth (HEAD); the lengths and GPU budget tests, then varlen_budget.py on eager attention at 0.7 with HEAD and with cbd967f (before the change).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap B=$PWD/snapb
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_lengths.py tests/test_gpu_budget.py > $OUT/pytest-run154.full 2>&1)
grep -v DEBUG $OUT/pytest-run154.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error' | tail -20 | cut -c1-400 | tee $OUT/pytest-run154.txt
for which in snap snapb; do
  (cd $PWD/$which && PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build timeout 170 python $S/bench/results/2026-12-10-session25/varlen_budget.py 0.7 2048,1536,2560,1024,3072,2048 48 eager > $OUT/varlen-eager-0.7-$which-run154.txt 2>&1)
  echo "== $which"; grep -v "^no offload" $OUT/varlen-eager-0.7-$which-run154.txt | awk '$10 == "False" || /plan:|exponent|Error|error/' | cut -c1-230 | tail -16
done
rm -f $OUT/*.full
