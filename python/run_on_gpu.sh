#!/usr/bin/env bash
# The package's GPU suite, one command on the GPU machine (run from the
# repository root; needs PyTorch with CUDA, a compiler and ninja there):
#   bash python/run_on_gpu.sh [OUT_DIR]
# Installs the package with pip and imports it outside the checkout, builds
# the checkout's extension with CUDA, prints the host cost per tensor
# (actoffload.host_cost), runs pytest over python/tests (the GPU
# tests and the simulator's), compute-sanitizer memcheck on a small model,
# and the demo table for Llama, GPT-2 and Qwen2-MoE with SDPA and eager
# attention. Outputs go to OUT_DIR (default $OUT, else python/gpu_results).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-python/gpu_results}}"
source python/gpu_steps.sh
# The install, and an import from outside the checkout, without PYTHONPATH.
step install env -u PYTHONPATH python3 -m pip install --no-build-isolation --no-index ./python
step import-outside env -u PYTHONPATH bash -c "cd /tmp && python3 -c 'import actoffload, actoffload._common as c; m = c.ext(); assert \"site-packages\" in actoffload.__file__, actoffload.__file__; print(m, actoffload.__file__, \"cuda\", m.with_cuda)'"
step uninstall env -u PYTHONPATH python3 -m pip uninstall -y actoffload
step build python3 -c "import actoffload._common as c; m = c.ext(); print(m, 'cuda', m.with_cuda)"
step host-cost python3 -m actoffload.host_cost
step pytest python3 -m pytest -q -rs -p no:cacheprovider python/tests
step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 python3 python/tests/sanitizer_model.py
for model in ${MODELS:-llama gpt2 moe}; do
  for attn in sdpa eager; do
    step "demo-$model-$attn" python3 -m actoffload.demo --model "$model" --attn "$attn" ${DEMO_ARGS:-}
  done
done
exit $status
