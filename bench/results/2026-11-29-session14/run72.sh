#!/usr/bin/env bash
# Issue 30, session 14 (run 72): compiled units recomputed around their compiled call; the tests that touch it, then the compiled sweep's three models.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 400 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning \
  tests/test_gpu_models.py -k "compiled" tests/test_budget_loops.py "tests/test_gpu_budget.py::test_budget_holds_with_each_decoder_layer_compiled" > $OUT/run72-tests.txt 2>&1
grep -v DEBUG $OUT/run72-tests.txt | grep -E '^E |passed|failed|FAILED|Error' | head -40
