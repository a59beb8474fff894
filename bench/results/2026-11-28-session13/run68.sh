#!/usr/bin/env bash
# Issue 30, session 13 (run 68): run 67's two failures after UnitHooks.in_force (warm machine, its build kept).
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 60 python -m pytest -q -p no:cacheprovider -x tests/test_selective.py::test_a_selective_offload_unit_sends_its_saved_outputs_through_the_engine "tests/test_gpu_budget.py::test_selective_offload_units_hold_less_and_stay_bit_identical" 2>&1 | tail -2
