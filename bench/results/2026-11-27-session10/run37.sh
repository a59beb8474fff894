#!/usr/bin/env bash
# Issue 30, session 10 (run 37): test_training_loops (and the rest of the loop tests) after the test fix.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
cd python
timeout 500 python -m pytest -q -p no:cacheprovider --timeout 240 --tb=short -W ignore tests/test_training_loops.py tests/test_training_loop_misuse.py tests/test_whole_model.py tests/test_te.py tests/test_fine_grained_abandon.py 2>&1 | tail -30 | tee $OUT/pytest.txt
