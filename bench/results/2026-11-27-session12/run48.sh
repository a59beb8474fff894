#!/usr/bin/env bash
# Issue 30, session 12 (run 48): the whole Python suite on torch 2.11 (inference-tensor, reentrant, stochastic-depth tests first run on the GPU).
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
(cd python && timeout 400 python -m pytest -q -p no:cacheprovider --timeout 200 --tb=short -W ignore tests 2>&1 | tail -60 > $OUT/pytest.txt)
tail -12 $OUT/pytest.txt
