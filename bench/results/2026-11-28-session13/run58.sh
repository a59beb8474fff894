#!/usr/bin/env bash
# Issue 30, session 13 (run 58): the sweep's architectures run 57 could not build or reach, Bloom/OPT/Falcon blocks after the cover rule; then SDPA on five.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
S=bench/results/2026-11-28-session13/models_sweep.py
timeout 300 python -W ignore $S Phi3Config OPTConfig FalconConfig BloomConfig Qwen3MoeConfig Starcoder2Config MptConfig CodeGenConfig XGLMConfig GlmConfig SmolLM3Config BertConfig T5Config > $OUT/sweep.txt 2> $OUT/sweep-err.txt
echo "rc $?" >> $OUT/sweep.txt
cat $OUT/sweep.txt
timeout 200 python -W ignore $S --sdpa LlamaConfig Qwen2Config Gemma2Config GPT2Config MixtralConfig > $OUT/sweep-sdpa.txt 2> $OUT/sweep-sdpa-err.txt
echo "rc $?" >> $OUT/sweep-sdpa.txt
cat $OUT/sweep-sdpa.txt
