#!/usr/bin/env bash
# Issue 30, session 12 (run 55): what the issue's Llama plan's copies cost beyond the model (the kept plan against the same plan without copies).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 300 python bench/results/2026-11-27-session12/offload_cost.py 0.41 12 > $OUT/offload-cost.txt 2>&1
echo "rc $?" >> $OUT/offload-cost.txt
grep -v "Warn\|warn\|with ctx\|return Variable" $OUT/offload-cost.txt | tail -12
