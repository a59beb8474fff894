#!/usr/bin/env bash
# Issue 30, session 15 (run 86): loop tests after the quiet drop of a forward that handed nothing over, and the compiled variants of three budget loop tests.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 400 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_loops.py tests/test_training_loops.py tests/test_training_loop_misuse.py tests/test_whole_model.py tests/test_gpu_loops.py tests/test_gpu.py > $OUT/run86.txt 2>&1
grep -v DEBUG $OUT/run86.txt | grep -E '^E |passed|failed|FAILED' | tail -20
