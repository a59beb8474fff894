#!/usr/bin/env bash
# Issue 30, session 24 (run 148): the binding built with narrower torch headers (torch/csrc/utils/pybind.h, not torch/extension.h) under torch 2.11 with CUDA: the build's time, the out-of-memory file, and the CUDA smoke tests of each door.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
start=$(date +%s)
python -c "import actoffload, actoffload._common as c; print(c.ext())" 2>&1 | tail -2 | tee $OUT/build-run148.txt
echo "build and import: $(( $(date +%s) - start )) s" | tee -a $OUT/build-run148.txt
timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run148-oom.full 2>&1
grep -v DEBUG $OUT/pytest-run148-oom.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped' | tail -20 | cut -c1-600 | tee $OUT/pytest-run148-oom.txt
timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu.py tests/test_gpu_loops.py > $OUT/pytest-run148-gpu.full 2>&1
grep -v DEBUG $OUT/pytest-run148-gpu.full | grep -E '^E |passed|failed|FAILED' | tail -20 | cut -c1-400 | tee $OUT/pytest-run148-gpu.txt
