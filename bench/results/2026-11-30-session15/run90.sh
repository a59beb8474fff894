#!/usr/bin/env bash
# Issue 30, session 15 (run 90): encoder-decoders with both stacks found (T5, BART), eager and SDPA, and Llama as a control; then test_whole_model.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
S=bench/results/2026-11-30-session15/models_sweep.py
timeout 260 python $S T5Config BartConfig LlamaConfig 2>&1 | grep -v DEBUG > $OUT/sweep-encdec-eager-run90.txt
cat $OUT/sweep-encdec-eager-run90.txt | cut -c1-230
timeout 200 python $S --sdpa T5Config BartConfig 2>&1 | grep -v DEBUG > $OUT/sweep-encdec-sdpa-run90.txt
cat $OUT/sweep-encdec-sdpa-run90.txt | cut -c1-230
cd python && timeout 100 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_whole_model.py > $OUT/run90-tests.txt 2>&1
grep -E '^E |passed|failed|FAILED' $OUT/run90-tests.txt | tail -8
