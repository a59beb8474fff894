#!/usr/bin/env bash
# Issue 30, session 14 (run 79): every door on a whole model compiled (torch.compile(model)): does it run, equal, lower the peak? (.gpu/diag79.py)
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 400 python -W ignore ../../diag79.py MistralConfig GPT2Config > $OUT/run79.txt 2> $OUT/run79.err
echo rc $?
cat $OUT/run79.txt
grep -v DEBUG $OUT/run79.err | grep -v '^\s*$' | tail -30
