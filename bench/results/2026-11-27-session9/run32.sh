#!/usr/bin/env bash
# Issue 30, session 9: test_selective at HEAD, then eager Llama after the recomputed forward's transient.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
(cd python && timeout 100 python -m pytest -q -p no:cacheprovider tests/test_selective.py tests/test_selective_storage.py 2>&1) > $OUT/pytest.txt
tail -2 $OUT/pytest.txt
timeout 400 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6,0.45 --steps 8 --out /tmp/e > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "^  " | tail -12; cp /tmp/e/* $OUT/ 2>/dev/null
grep -hE "warm-up|measured above" $OUT/plans-*.txt
