#!/usr/bin/env bash
# Issue 30, session 18 (run 107): the compiled-whole warning fix on the GPU; then the issue's SDPA Llama h2048 x 4096 target (<= 0.97 x checkpointing at 0.45), 30 interleaved rounds.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_models.py tests/test_whole_model.py -k "compiled_whole or two_models or whole_forwards" > $OUT/pytest-run107.full 2>&1)
grep -v DEBUG $OUT/pytest-run107.full | grep -E '^E |passed|failed|FAILED' | tail -10
mkdir -p $OUT/sdpa
cd python && timeout 330 python -W ignore -m actoffload.budget_bench --models llama --fractions 0.8,0.6,0.45 --steps 30 --out $OUT/sdpa > $OUT/sdpa/log.txt 2> $OUT/sdpa/err.txt
cat $OUT/sdpa/table.txt; tail -3 $OUT/sdpa/err.txt
