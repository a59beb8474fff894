#!/usr/bin/env bash
# Issue 30, session 21 (run 128): the steady-state scenario step by step (diag128.py), then the out-of-memory GPU tests with windows that begin one unit early.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 150 python ../../diag128.py > $OUT/diag128.txt 2>&1)
grep -v Warn $OUT/diag128.txt | grep -v "with ctx" | tail -60
(cd python && timeout 300 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run128.full 2>&1)
grep -v DEBUG $OUT/pytest-run128.full | grep -E '^E |passed|failed|FAILED|XPASS|xfail|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations|race steps skipped|^kept|windows' | tail -60 | tee $OUT/pytest-run128.txt
