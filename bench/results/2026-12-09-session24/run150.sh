#!/usr/bin/env bash
# Issue 30, session 24 (run 150): is the steady out-of-memory test's failure in run 149 (13 plans failed; 565 MB allocated before each step after a backward's failure, 397 before) the change of 1ebc57e? The test three times at HEAD (snap) and three times with 1ebc57e's engine and binding change reversed (snapB), alternating.
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
for i in 1 2 3; do
  for s in snap snapB; do
    (cd $s/python && PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/../build timeout 100 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=line -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py -k no_longer_holds_gives_way > $OUT/run150-$s-$i.full 2>&1)
    echo "== $s $i: $(grep -E 'passed|failed' $OUT/run150-$s-$i.full | tail -1)" | tee -a $OUT/run150.txt
    grep -E '^failed' $OUT/run150-$s-$i.full | sed 's/.*raised in/raised in/' | cut -c1-160 | tee -a $OUT/run150.txt
    rm -f $OUT/run150-$s-$i.full
  done
done
