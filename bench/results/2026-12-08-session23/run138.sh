#!/usr/bin/env bash
# Issue 30, session 23 (run 138): the whole out-of-memory GPU file, twice, at session 22's last code (1e2c6ff).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee $OUT/gpu.txt
for i in 1 2; do
(cd python && timeout 200 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_gpu_out_of_memory.py > $OUT/pytest-run138-$i.full 2>&1)
grep -v DEBUG $OUT/pytest-run138-$i.full | grep -E '^E |passed|failed|FAILED|^kept|^failed|race steps skipped|runs again|runs on|gives way|smallest' | tail -40 | cut -c1-1200 | tee $OUT/pytest-run138-$i.txt
done
