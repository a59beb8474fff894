#!/usr/bin/env bash
# Issue 30, session 13 (run 65): the budget on compiled layers of architectures nobody here wrote (eager attention).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
S=bench/results/2026-11-28-session13/models_sweep.py
timeout 420 python -W ignore $S --compile MistralConfig GPT2Config Qwen2MoeConfig Phi3Config GPTNeoXConfig > $OUT/sweep-compile.txt 2> $OUT/sweep-compile-err.txt
echo "rc $?" >> $OUT/sweep-compile.txt
cat $OUT/sweep-compile.txt; grep -E "Error|error" $OUT/sweep-compile-err.txt | sort | uniq -c | head -10
