#!/usr/bin/env bash
# Issue 30, session 9: second sample of the issue's Llama bench at HEAD.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 380 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.6,0.41,0.3 --steps 8 --out /tmp/b > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | tail -12; cp /tmp/b/* $OUT/ 2>/dev/null
grep -E "warm-up|measured above" $OUT/plans-llama*.txt
