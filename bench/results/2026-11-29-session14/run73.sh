#!/usr/bin/env bash
# Issue 30, session 14 (run 73): the new compiled test with the fix planted out (its wrapper at `forward`, traced by dynamo), then the compiled sweep.
cd "$(dirname "$0")/snap/python"
export PYTHONPATH=$PWD ACTOFFLOAD_BUILD_DIR=$PWD/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
cp actoffload/recompute.py /tmp/recompute.py
sed -i 's/return "_compiled_call_impl" if compiled(unit) else "forward"/return "forward"/' actoffload/recompute.py
grep -n 'return "forward"' actoffload/recompute.py
timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=line -W ignore tests/test_gpu_models.py -k "equal_the_compiled" 2>&1 | grep -v DEBUG | tail -6
cp /tmp/recompute.py actoffload/recompute.py
cd ..
timeout 380 python -W ignore bench/results/2026-11-28-session13/models_sweep.py --compile MistralConfig Phi3Config GPTNeoXConfig GPT2Config Qwen2MoeConfig > $OUT/sweep-compile-run73.txt 2> $OUT/sweep-compile-run73.err; echo rc $?; cat $OUT/sweep-compile-run73.txt
