#!/usr/bin/env bash
# Issue 30, session 22 (run 133): the out-of-memory GPU tests with the plans for longer batches giving way, and each error's origin.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 200 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py tests/test_gpu_budget.py > $OUT/pytest-run133.full 2>&1)
grep -v DEBUG $OUT/pytest-run133.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|profile iterations|File|raise|^ *[a-z_.]+\(' | tail -60 | tee $OUT/pytest-run133.txt
# The same out-of-memory tests with the allocator's expandable segments (does the edge's fragmentation go?).
(cd python && PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run133-expandable.full 2>&1)
grep -v DEBUG $OUT/pytest-run133-expandable.full | grep -E '^E |passed|failed|FAILED|^kept|race steps skipped|profile iterations' | tail -30 | tee $OUT/pytest-run133-expandable.txt
