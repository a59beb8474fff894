#!/usr/bin/env bash
# Issue 30, session 13 (run 67): the whole Python suite on the GPU (the last code of session 13).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1 || tail -20 $OUT/build.txt
cd python
timeout 560 python -m pytest -q -p no:cacheprovider tests > $OUT/pytest-all.txt 2>&1
grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)|passed|failed" $OUT/pytest-all.txt | cut -c1-400 | tail -25
