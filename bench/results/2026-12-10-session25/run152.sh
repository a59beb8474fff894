#!/usr/bin/env bash
# Issue 30, session 25 (run 152): the issue's headline re-measured at fdd2d7b (last measured at session 12's 7311725): SDPA Llama h4096 x 8192 at 0.41 and 0.3, then eager Llama h2048 at 0.8 and 0.6 (layers).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
mkdir -p $OUT/llama $OUT/eager
timeout 300 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.41,0.3 --steps 8 --out $OUT/llama > $OUT/llama/bench.txt 2>&1
echo "llama rc $?" >> $OUT/llama/bench.txt
grep -v Warn $OUT/llama/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -8
timeout 230 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6 --steps 10 --out $OUT/eager > $OUT/eager/bench.txt 2>&1
echo "eager rc $?" >> $OUT/eager/bench.txt
grep -v Warn $OUT/eager/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -8
rm -f $OUT/*/rows.json
