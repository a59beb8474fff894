#!/usr/bin/env bash
# Issue 30, session 10 (run 35): the GPU tests left unrun by session 9 and the new loop tests.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
cd python
timeout 560 python -m pytest -q -p no:cacheprovider --timeout 240 tests/test_selective.py tests/test_selective_storage.py tests/test_gpu_budget.py tests/test_gpu_loops.py tests/test_budget_loops.py 2>&1 | tail -60 | tee $OUT/pytest.txt
