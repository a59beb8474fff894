#!/usr/bin/env bash
# Issue 30, session 15 (run 93): the Hugging Face model tests and TE's door at the session's last code.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 300 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_models.py tests/test_te.py > $OUT/run93.txt 2>&1
grep -v DEBUG $OUT/run93.txt | grep -E '^E |passed|failed|FAILED' | tail -12
