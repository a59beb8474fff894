#!/usr/bin/env bash
# Issue 30, session 8: per-stretch peaks of forced plans against the model.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
timeout 200 python ../stretch.py llama sdpa 4096 8192 8192 2.75 0.3 RRRRRRRK,RRRRRRSS,SSSSSSSS,RKRKRKRK,KKKKRRRK $OUT/llama.json > $OUT/llama.txt 2>&1
echo "rc $?" >> $OUT/llama.txt
grep -v Warn $OUT/llama.txt | tail -75
timeout 150 python ../stretch.py llama eager 2048 4096 0 0 0.45 RRRRRRKK,SSSSSSKK,RRRSRRKK $OUT/eager.json > $OUT/eager.txt 2>&1
echo "rc $?" >> $OUT/eager.txt
grep -v Warn $OUT/eager.txt | tail -45
