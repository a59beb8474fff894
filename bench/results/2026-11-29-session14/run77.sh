#!/usr/bin/env bash
# Issue 30, session 14 (run 77): checkpoint around or inside compiled layers, timed interleaved (compiled_ckpt.py).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,utilization.gpu --format=csv,noheader
timeout 280 python -W ignore ../../bench/results/2026-11-29-session14/compiled_ckpt.py 2048 4 7 2>$OUT/run77.err | tee $OUT/compiled-ckpt-h2048-run77.txt
timeout 250 python -W ignore ../../bench/results/2026-11-29-session14/compiled_ckpt.py 4096 4 2>>$OUT/run77.err | tee $OUT/compiled-ckpt-h4096-run77.txt
grep -v DEBUG $OUT/run77.err | tail -5
