#!/usr/bin/env bash
# Issue 30, session 14 (run 81): a model compiled whole, what reaches the package (.gpu/diag81.py).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 200 python ../../diag81.py > $OUT/run81.txt 2> $OUT/run81.err
echo rc $?; cat $OUT/run81.txt; grep -v DEBUG $OUT/run81.err | grep -v '^\s*$' | tail -8
