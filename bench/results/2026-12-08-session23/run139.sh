#!/usr/bin/env bash
# Issue 30, session 23 (run 139): plans for longer batches checked (fbbfba8): the GPU test, the out-of-memory file, the CPU lengths tests under torch 2.11.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 200 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py -k longer_than > $OUT/pytest-run139-longer.full 2>&1
grep -v DEBUG $OUT/pytest-run139-longer.full | grep -E '^E |passed|failed|FAILED|^budget|^\(|peaked|^  [0-9]' | cut -c1-600 | tail -60 > $OUT/pytest-run139-longer.txt
timeout 100 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short tests/test_budget_lengths.py tests/test_budget_out_of_memory.py > $OUT/pytest-run139-cpu.txt 2>&1
timeout 200 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run139-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run139-oom.full | grep -E '^E |passed|failed|FAILED|^kept|^failed|race steps skipped|runs again|runs on|gives way|smallest|peaked' | tail -50 | cut -c1-900 > $OUT/pytest-run139-oom.txt
tail -3 $OUT/pytest-run139-cpu.txt; tail -3 $OUT/pytest-run139-longer.txt; tail -3 $OUT/pytest-run139-oom.txt
