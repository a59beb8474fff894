#!/usr/bin/env bash
# Issue 30, session 15 (run 91): T5 with SDPA, each gradient's spread over repeats and under HF's own checkpointing.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 200 python bench/results/2026-11-30-session15/diag_t5.py 2>&1 | grep -v -E "DEBUG|Warning|^  (return|with)" > $OUT/diag-t5-run91.txt
cat $OUT/diag-t5-run91.txt | cut -c1-200
