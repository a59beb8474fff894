#!/usr/bin/env bash
# Issue 30, session 12 (run 52): block units on the issue's SDPA Llama at 0.41 (layer and block in one process), then GPT-2 at 0.8 and 0.6 (layer and block).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
mkdir -p $OUT/llama $OUT/gpt2
timeout 330 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.41 --granularities layer,block --steps 8 --out $OUT/llama > $OUT/llama/bench.txt 2>&1
echo "llama rc $?" >> $OUT/llama/bench.txt
grep -v Warn $OUT/llama/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -7
grep -h "warm-up" $OUT/llama/plans-*.txt
timeout 200 python -m actoffload.budget_bench --models gpt2 --fractions 0.8,0.6 --granularities layer,block --steps 8 --out $OUT/gpt2 > $OUT/gpt2/bench.txt 2>&1
echo "gpt2 rc $?" >> $OUT/gpt2/bench.txt
grep -v Warn $OUT/gpt2/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -9
grep -h "warm-up" $OUT/gpt2/plans-*.txt
rm -f $OUT/*/rows.json
