#!/usr/bin/env bash
# Issue 30, session 9: GPT-2 and Qwen2-MoE with selective-offload and the least-work rule.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 450 python -m actoffload.budget_bench --models gpt2,moe --fractions 0.8,0.6,0.45 --steps 8 --out /tmp/g > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "^  " | tail -24; cp /tmp/g/* $OUT/ 2>/dev/null
grep -hE "warm-up|measured above" $OUT/plans-*.txt
