#!/usr/bin/env bash
# Issue 30, session 10 (run 42): the refactored GPU loop tests and the budget loop tests at the final code.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
cd python
timeout 200 python -m pytest -q -p no:cacheprovider --timeout 150 --tb=short -W ignore tests/test_gpu_loops.py tests/test_budget_loops.py tests/test_selective.py 2>&1 | tail -15 | tee $OUT/pytest.txt
