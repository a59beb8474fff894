#!/usr/bin/env bash
# Issue 30, session 18 (run 109): the race's rematch on the GPU: the budget's GPU tests, then SDPA Llama h2048 x 4096 at 0.8 (run 108's case).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py tests/test_joint_budget.py > $OUT/pytest-run109.full 2>&1)
grep -v DEBUG $OUT/pytest-run109.full | grep -E '^E |passed|failed|FAILED' | tail -10
mkdir -p $OUT/sdpa
cd python && timeout 190 python -W ignore -m actoffload.budget_bench --models llama --fractions 0.8 --steps 20 --out $OUT/sdpa > $OUT/sdpa/log.txt 2> $OUT/sdpa/err.txt
cat $OUT/sdpa/table.txt; grep "warm-up trials" $OUT/sdpa/plans-llama.txt | cut -c1-400; tail -2 $OUT/sdpa/err.txt
