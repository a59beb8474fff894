#!/usr/bin/env bash
# Issue 30, session 21 (run 126): the out-of-memory GPU tests (windows at half the room, the block stitch printed, the steady-state test never run before).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 540 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run126.full 2>&1)
grep -v DEBUG $OUT/pytest-run126.full | grep -E '^E |passed|failed|FAILED|XFAIL|xfail|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations|^predicted|race steps skipped|windows' | tail -120 | tee $OUT/pytest-run126.txt
