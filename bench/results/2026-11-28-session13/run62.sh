#!/usr/bin/env bash
# Issue 30, session 13 (run 62): OPT SDPA at test_gpu_models.py's size: what the race measured against what the user measures.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
PYTHONPATH=$PYTHONPATH:$PWD/python/tests timeout 120 python -W ignore bench/results/2026-11-28-session13/opt_peak.py > $OUT/opt-peak.txt 2>&1
cat $OUT/opt-peak.txt | cut -c1-3000
