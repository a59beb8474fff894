#!/usr/bin/env bash
# Issue 30, session 27 (run 168): budget_bench on GPT-2 (layer and block units) and Qwen2-MoE at c50362b (last measured at sessions 8, 9 and 12).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > /dev/null 2>&1
mkdir -p $OUT/gpt2 $OUT/moe
timeout 330 python -m actoffload.budget_bench --models gpt2 --fractions 0.8,0.6,0.45,0.3 --granularities layer,block --steps 10 --out $OUT/gpt2 > $OUT/gpt2/bench.txt 2>&1
echo "gpt2 rc $?" >> $OUT/gpt2/bench.txt
grep -v Warn $OUT/gpt2/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -16
timeout 230 python -m actoffload.budget_bench --models moe --fractions 0.8,0.6,0.45 --steps 10 --out $OUT/moe > $OUT/moe/bench.txt 2>&1
echo "moe rc $?" >> $OUT/moe/bench.txt
grep -v Warn $OUT/moe/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -10
rm -f $OUT/*/rows.json
