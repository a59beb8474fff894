#!/usr/bin/env bash
# Issue 30, session 12 (run 53): where the issue's Llama plans at 0.41 spend their time (traces of each trial plan and of no offload), then the whole Python suite.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 200 python bench/results/2026-11-27-session10/trace_eager.py $OUT 0.41 4096 8192 8192 2.75 sdpa > $OUT/trace-out.txt 2>&1
echo "trace rc $?" >> $OUT/trace-out.txt
grep -v "Warn\|warn" $OUT/trace-out.txt | tail -60
(cd python && timeout 300 python -m pytest -q -p no:cacheprovider --timeout 200 --tb=short -W ignore tests 2>&1 | tail -40 > $OUT/pytest.txt)
tail -5 $OUT/pytest.txt
