#!/usr/bin/env bash
# Issue 30, session 11 (run 43): eager Llama bench with measured re-runs, then the training-loop suites (the budget's door) on torch 2.11.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 300 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6,0.45 --steps 8 --out /tmp/b > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | tail -14; cp /tmp/b/* $OUT/ 2>/dev/null
cd python
timeout 240 python -m pytest -q -p no:cacheprovider --timeout 200 --tb=short -W ignore tests/test_training_loops.py tests/test_training_loop_misuse.py 2>&1 | tail -25 | tee $OUT/pytest.txt
