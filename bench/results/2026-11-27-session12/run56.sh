#!/usr/bin/env bash
# Issue 30, session 12 (run 56): the whole Python suite at the session's last code.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
(cd python && timeout 330 python -m pytest -q -p no:cacheprovider --timeout 200 --tb=short -W ignore tests 2>&1 | tail -40 > $OUT/pytest.txt)
tail -5 $OUT/pytest.txt
