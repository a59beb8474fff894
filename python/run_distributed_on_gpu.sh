#!/usr/bin/env bash
# The package's multi-GPU part, one command on a machine with 2 GPUs (from
# the repository root; PyTorch with CUDA and NCCL, a compiler and ninja):
#   bash python/run_distributed_on_gpu.sh [OUT_DIR]
# Builds the extension once (both ranks then load it), then runs with
# torchrun, one process per GPU: FSDP2 and tensor parallelism with each
# front door (actoffload.fsdp_bench), and torch.distributed.pipelining's
# Schedule1F1B and ScheduleInterleaved1F1B with a FineGrainedOffloader per
# rank (actoffload.pipeline_bench; Llama, and Qwen2-MoE). Each run fails unless every rank's loss
# and gradients are bit-identical to the same run without offloading.
# BENCH_ARGS is added to every run (e.g. "--hidden 512 --seq 512" to smoke).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-python/gpu_results}}"
source python/gpu_steps.sh
# NVLink multicast stays off in every process (the GPU machines' rule).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus="${GPUS:-2}"
run() {  # name, module, args...
  local name=$1 module=$2; shift 2
  step "$name" timeout "${RUN_TIMEOUT:-300}" torchrun --standalone --nproc_per_node "$gpus" \
    -m "$module" "$@" ${BENCH_ARGS:-}
}
step build python3 -c "import actoffload._common as c; m = c.ext(); print(m, 'cuda', m.with_cuda)"
run fsdp2 actoffload.fsdp_bench --parallel fsdp
run tp actoffload.fsdp_bench --parallel tp
run pipeline-1f1b actoffload.pipeline_bench --vpp 1
run pipeline-interleaved actoffload.pipeline_bench --vpp 2
# Megatron's pipeline-rank delta: rank r keeps r x 256 MiB more on device.
run pipeline-1f1b-delta actoffload.pipeline_bench --vpp 1 --delta 268435456
# Qwen2-MoE: the expert bank is a group of its own (expert_fc1).
run pipeline-1f1b-moe actoffload.pipeline_bench --vpp 1 --model moe
exit $status
