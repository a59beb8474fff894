#!/usr/bin/env bash
# Issue 30, session 13 (run 59): random ops in selective units (GPT-2 SDPA dropout): the tests, planted, and the sweep again; Gemma2 SDPA blocks' peak; T5.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
(cd python && timeout 200 python -m pytest -q -p no:cacheprovider tests/test_selective.py tests/test_selective_policy.py 2>&1 | tail -3)
cp python/actoffload/recompute.py /tmp/r.py
sed -i 's/ or _draws_random(op, args, kwargs or {}):/:/' python/actoffload/recompute.py
grep -c "_draws_random(op" python/actoffload/recompute.py
(cd python && timeout 100 python -m pytest -q -p no:cacheprovider tests/test_selective.py -k dropout 2>&1 | tail -2)
cp /tmp/r.py python/actoffload/recompute.py
S=bench/results/2026-11-28-session13/models_sweep.py
timeout 250 python -W ignore $S --sdpa GPT2Config Gemma2Config > $OUT/sweep-sdpa.txt 2> $OUT/sweep-sdpa-err.txt
echo "rc $?" >> $OUT/sweep-sdpa.txt
cat $OUT/sweep-sdpa.txt
timeout 100 python -W ignore $S T5Config > $OUT/sweep.txt 2> $OUT/sweep-err.txt
echo "rc $?" >> $OUT/sweep.txt
cat $OUT/sweep.txt; tail -5 $OUT/sweep-err.txt
