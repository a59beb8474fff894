#!/usr/bin/env bash
# Issue 30, session 8: GPU tests on torch 2.11 after the profile fix; eager Llama sweep.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
( cd python && timeout 200 python -m pytest -q -p no:cacheprovider tests/test_gpu_budget.py tests/test_joint_budget.py tests/test_selective.py ) > $OUT/pytest.txt 2>&1
echo "pytest rc $?" >> $OUT/pytest.txt
grep -E "passed|failed|^E |^FAILED" $OUT/pytest.txt | head -20
timeout 330 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6,0.45 --steps 8 --out /tmp/e > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | tail -12; cp /tmp/e/* $OUT/ 2>/dev/null
grep -E "warm-up|measured above" $OUT/plans-llama*.txt
