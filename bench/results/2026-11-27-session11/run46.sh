#!/usr/bin/env bash
# Issue 30, session 11 (run 46): GPT-2 and eager Llama with measured re-runs (final planner code).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
mkdir -p $OUT/gpt2 $OUT/eager
timeout 250 python -m actoffload.budget_bench --models gpt2 --fractions 0.8,0.6,0.45 --steps 8 --out $OUT/gpt2 > $OUT/gpt2/bench.txt 2>&1
echo "gpt2 rc $?" >> $OUT/gpt2/bench.txt
grep -v Warn $OUT/gpt2/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -13
timeout 250 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6 --steps 8 --out $OUT/eager > $OUT/eager/bench.txt 2>&1
echo "eager rc $?" >> $OUT/eager/bench.txt
grep -v Warn $OUT/eager/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -9
grep -h "warm-up" $OUT/*/plans-*.txt
