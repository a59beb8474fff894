#!/usr/bin/env bash
# Issue 30, session 20 (run 121): the windows test again, budget 0.45 of the no-offload peak (run 120: at 0.6 a race plan found no 32 MiB among 153 MiB reserved but unused).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print(torch.cuda.get_per_process_memory_fraction(0), torch.cuda.mem_get_info())"
(cd python && timeout 500 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py -k windows > $OUT/pytest-run121.full 2>&1)
grep -v DEBUG $OUT/pytest-run121.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations' | tail -60 | tee $OUT/pytest-run121.txt
