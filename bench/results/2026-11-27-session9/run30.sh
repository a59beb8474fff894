#!/usr/bin/env bash
# Issue 30, session 9: per-stretch peaks of selective-offload plans at 0.3.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 250 python ../stretch9.py llama sdpa 4096 8192 8192 2.75 0.3 QQQQSRRK,SSSSSRRK $OUT/llama.json > $OUT/llama.txt 2>&1
echo "rc $?" >> $OUT/llama.txt
grep -E "^== |^  [0-9] |rc |measured above|^plan:|predicted step" $OUT/llama.txt | tail -40
