#!/usr/bin/env bash
# Issue 30, session 10 (run 38): skipped batches in the warm-up; the byte budget test on torch 2.11.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
cd python
timeout 400 python -m pytest -q -p no:cacheprovider --timeout 240 --tb=short -W ignore tests/test_whole_model.py tests/test_gpu_loops.py::test_skipped_batches_and_eval_passes_during_the_budgets_warm_up 2>&1 | tail -30 | tee $OUT/pytest.txt
