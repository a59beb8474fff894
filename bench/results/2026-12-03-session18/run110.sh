#!/usr/bin/env bash
# Issue 30, session 18 (run 110): run 108's trace at 0.8 with the rematch: which plan the race keeps, and each trial timed after it.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16
timeout 170 python -u -W ignore bench/results/2026-11-27-session10/trace_eager.py $OUT 0.8 2048 4096 32000 2.6875 sdpa > $OUT/log-0.8.txt 2>&1
grep -E "^no offload|^kept|^== " $OUT/log-0.8.txt
