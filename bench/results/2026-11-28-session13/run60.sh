#!/usr/bin/env bash
# Issue 30, session 13 (run 60): test_gpu_models.py (8 architectures x eager/SDPA), with the race's refusal; the budget's GPU tests.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
cd python
timeout 400 python -m pytest -q -p no:cacheprovider --durations=8 tests/test_gpu_models.py > $OUT/pytest-models.txt 2>&1
tail -30 $OUT/pytest-models.txt
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gpu_budget.py tests/test_joint_budget.py tests/test_selective.py > $OUT/pytest-budget.txt 2>&1
tail -5 $OUT/pytest-budget.txt
