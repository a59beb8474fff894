#!/usr/bin/env bash
# Issue 30, session 14 (run 71): compiled layers recomputed, each way, against each other (.gpu/diag71.py).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 280 python -W ignore ../../diag71.py > $OUT/run71.txt 2>&1
grep -v DEBUG $OUT/run71.txt | tail -40
