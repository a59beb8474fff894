#!/usr/bin/env bash
# Issue 30, session 26 (run 159): the out-of-memory file at HEAD, then varlen_budget.py with SDPA at 0.5 (96 steps).
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
(cd $S/python && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 300 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run159-oom.full 2>&1)
grep -v DEBUG $OUT/pytest-run159-oom.full | grep -E '^E |passed|failed|FAILED|PASSED|^tests/.*Error' | tail -14 | cut -c1-300 | tee $OUT/pytest-run159-oom.txt
(cd $S && PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build timeout 150 python $S/bench/results/2026-12-11-session26/varlen_budget.py 0.5 2048,1536,2560,1024,3072,2048 96 sdpa > $OUT/varlen-sdpa-0.5-run159.txt 2>&1)
grep -v "^no offload" $OUT/varlen-sdpa-0.5-run159.txt | awk '$10 == "False" || /plan:|exponent|Error|error/' | cut -c1-150 | tail -14
rm -f $OUT/*.full
