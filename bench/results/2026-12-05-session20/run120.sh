#!/usr/bin/env bash
# Issue 30, session 20 (run 120): the budget's profile in windows on a device that cannot hold a plain step (test_gpu_out_of_memory.py), and the budget files.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print(torch.cuda.get_per_process_memory_fraction(0), torch.cuda.mem_get_info())"
(cd python && timeout 500 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py tests/test_gpu_budget.py > $OUT/pytest-run120.full 2>&1)
grep -v DEBUG $OUT/pytest-run120.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations' | tail -60 | tee $OUT/pytest-run120.txt
