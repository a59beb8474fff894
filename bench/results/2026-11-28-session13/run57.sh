#!/usr/bin/env bash
# Issue 30, session 13 (run 57): every front door on Hugging Face architectures nobody here wrote.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
python -c "import transformers; print('transformers', transformers.__version__)"
timeout 520 python -W ignore bench/results/2026-11-28-session13/models_sweep.py > $OUT/sweep.txt 2> $OUT/sweep-err.txt
echo "rc $?" >> $OUT/sweep.txt
cat $OUT/sweep.txt
