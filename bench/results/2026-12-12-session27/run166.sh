#!/usr/bin/env bash
# Issue 30, session 27 (run 166): the out-of-memory file alone at HEAD; then test_gpu_budget.py and that file in one process (run 165's failure), -x, full message.
cd "$(dirname "$0")"
export MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$PWD/snap
cd $S/python
export PYTHONPATH=$S/python ACTOFFLOAD_BUILD_DIR=$S/build
timeout 240 python -m pytest -v -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run166-oom.full 2>&1
echo "rc $?"
grep -v DEBUG $OUT/pytest-run166-oom.full | grep -E '^E |passed|failed|FAILED|PASSED|^tests/.*Error' | tail -14 | cut -c1-300 | tee $OUT/pytest-run166-oom.txt
timeout 300 python -m pytest -v -x -s -p no:cacheprovider -p no:logging --tb=long -W ignore::DeprecationWarning tests/test_gpu_budget.py "tests/test_gpu_out_of_memory.py::test_a_loop_that_skips_batches_out_of_memory_settles_on_a_plan_the_device_holds" > $OUT/pytest-run166-both.full 2>&1
echo "rc $?"
grep -v DEBUG $OUT/pytest-run166-both.full | grep -E '^E |passed|failed|FAILED|PASSED|Error|skipped [0-9]|room' | tail -40 | cut -c1-400 | tee $OUT/pytest-run166-both.txt
grep -v DEBUG $OUT/pytest-run166-both.full | tail -60 | cut -c1-300 > $OUT/pytest-run166-both-tail.txt
rm -f $OUT/*.full
