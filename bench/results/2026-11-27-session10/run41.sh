#!/usr/bin/env bash
# Issue 30, session 10 (run 41): copies at push on eager Llama: traces at 0.8, then the bench with --copy-at-push.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import actoffload._common as c; c.ext()" 2>&1 | tail -1
mkdir -p $OUT/trace
timeout 150 python bench/results/2026-11-27-session10/trace_eager.py $OUT/trace 0.8 2>&1 | grep -v "Warning\|with ctx\|_warn_once" | tail -60
mkdir -p $OUT/bench
timeout 330 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6 --steps 8 --copy-at-push --out $OUT/bench > $OUT/bench/log.txt 2>&1
cat $OUT/bench/table.txt; grep -A14 "joint/layer" $OUT/bench/log.txt | grep "warm-up" | cut -c1-400
