#!/usr/bin/env bash
# Issue 30, session 14 (run 80, 82): a model compiled whole is warned about (new test), with the compiled tests and test_whole_model beside it.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 230 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_models.py tests/test_whole_model.py -k "whole" > $OUT/run82.txt 2>&1
grep -v DEBUG $OUT/run82.txt | grep -E '^E |passed|failed|FAILED' | tail -20
