#!/usr/bin/env bash
# Issue 30, session 21 (run 130): the steady-state scenario traced (diag130.py), then test_gpu_budget.py with JointRace::OutOfMemory's new lowering.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 150 python ../../diag130.py > $OUT/diag130.txt 2>&1)
grep -v Warn $OUT/diag130.txt | grep -v "with ctx" | tail -90
(cd python && timeout 240 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_budget.py > $OUT/pytest-run130.full 2>&1)
grep -v DEBUG $OUT/pytest-run130.full | grep -E '^E |passed|failed|FAILED' | tail -20 | tee $OUT/pytest-run130.txt
