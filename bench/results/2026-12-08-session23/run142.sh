#!/usr/bin/env bash
# Issue 30, session 23 (run 142): what holds device memory after a longer batch's step runs out of memory in its backward.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python:$PWD/python/tests ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd python
timeout 300 python -W ignore ../bench/results/2026-12-08-session23/diag142.py 2>&1 | grep -v "^actoffload: \(compil\|built\)" | tee $OUT/diag142.txt | tail -60
