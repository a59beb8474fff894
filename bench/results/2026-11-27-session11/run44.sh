#!/usr/bin/env bash
# Issue 30, session 11 (run 44): the whole Python suite (in-place fix, varying lengths), then the issue's Llama at 0.41 with measured re-runs.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
(cd python && timeout 270 python -m pytest -q -p no:cacheprovider --timeout 200 --tb=short -W ignore tests 2>&1 | tail -30 > $OUT/pytest.txt)
tail -8 $OUT/pytest.txt
timeout 300 python -m actoffload.budget_bench --models llama --hidden 4096 --seq 8192 --vocab 8192 --ffn 2.75 --fractions 0.41 --steps 10 --out /tmp/b > $OUT/bench.txt 2>&1
echo "bench rc $?" >> $OUT/bench.txt
grep -v Warn $OUT/bench.txt | grep -v "with wrap" | tail -8; cp /tmp/b/* $OUT/ 2>/dev/null
grep -E "warm-up|measured above|recompute_ms" -A0 $OUT/plans-llama*.txt | head; grep -A4 "recompute_ms" $OUT/plans-llama*.txt | head -5
