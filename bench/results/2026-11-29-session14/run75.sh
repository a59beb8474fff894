#!/usr/bin/env bash
# Issue 30, session 14 (run 75): run 74's failure (CUDA initialized inside a checkpoint by dynamo's first compilation), alone, as it ran there (second in its file).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore tests/test_budget_loops.py 2>&1 | grep -v DEBUG | grep -E '^E |passed|failed|FAILED' | tail -8
