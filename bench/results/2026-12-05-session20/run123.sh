#!/usr/bin/env bash
# Issue 30, session 20 (run 123): after the windows end at a unit's end (no wrappers in a forward that fits): run 122's three failures, the windows tests (layers, blocks, compiled layers) and the GPU budget file.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python && timeout 520 python -m pytest -q -s -p no:cacheprovider -p no:logging --tb=short -W ignore::DeprecationWarning tests/test_budget_windows.py tests/test_gpu_models.py::test_a_model_compiled_whole_is_warned_about_not_left_alone_silently tests/test_gpu_out_of_memory.py tests/test_gpu_budget.py > $OUT/pytest-run123.full 2>&1)
grep -v DEBUG $OUT/pytest-run123.full | grep -E '^E |passed|failed|FAILED|^tests/.*Error|plain peak|saved bytes|transients|^\[|profile iterations|^predicted|^   [0-9] ' | tail -80 | tee $OUT/pytest-run123.txt
