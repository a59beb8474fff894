#!/usr/bin/env bash
# Issue 30, session 23 (run 143): the longer-batch out-of-memory test's set-up, what stays allocated after each failed step.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python:$PWD/python/tests ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 300 python -W ignore ../bench/results/2026-12-08-session23/diag143.py 2>&1 | grep -v "^actoffload: \(compil\|built\)" | tee $OUT/diag143.txt | tail -60
