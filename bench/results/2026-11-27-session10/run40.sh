#!/usr/bin/env bash
# Issue 30, session 10 (run 40): the whole Python suite on the GPU machine (torch 2.11).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name --format=csv,noheader
cd python
timeout 560 python -m pytest -q -p no:cacheprovider --timeout 300 --tb=short -W ignore tests 2>&1 | tail -40 | tee $OUT/pytest.txt
