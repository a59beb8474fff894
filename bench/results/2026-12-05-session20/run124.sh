#!/usr/bin/env bash
# Issue 30, session 20 (run 124): the windows tests after run 123 (the room says a plain step cannot fit; each profile step within it).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 520 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py -k windows > $OUT/pytest-run124.full 2>&1)
grep -v DEBUG $OUT/pytest-run124.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations|^predicted|^   [0-9] ' | tail -80 | tee $OUT/pytest-run124.txt
