// One training step of the layer stack (layer_stack.h: the same 15 GEMMs per
// layer, the same saved tensors) through the fine-grained front door,
// PipelineOffloader (engine/pipeline_offload.h, SPEC §5), as one pipeline
// chunk (stage 0, microbatch 0) on pipeline rank 0.
//
// Each forward GEMM of a layer is one named group, after Megatron's
// submodules; the group saves the GEMM's input:
//
//   group        saves   forward GEMM
//   qkv_linear   x       qkv  = x    · Wqkv
//   core_attn    qkv     attn = qkv  · Wa     (stand-in for attention)
//   attn_proj    attn    o    = attn · Wo
//   expert_fc1   o       u    = o    · Wup
//   moe_act      u       y    = u    · Wdown
//
// Forward, per group: GroupStart(name), Push(input), the GEMM,
// GroupCommit(name) with no release_tensors; then the driver drops its own
// reference to the input (as RunStep does), so the engine can free it once
// its copy to host is done.
// Backward, per layer in reverse and per group in reverse commit order:
// GroupBackwardStart(name), Pop, the module's input-gradient GEMM and its
// weight-gradient GEMM (which reads the popped tensor), GroupBackwardEnd(name).
// Then FinishIteration(). The first step is the engine's warm-up.

#ifndef OFFLOAD_BENCH_PIPELINE_STEP_H_
#define OFFLOAD_BENCH_PIPELINE_STEP_H_

#include "bench/layer_stack.h"
#include "engine/pipeline_offload.h"

namespace offload::bench {

// The group names, in commit order within a layer.
inline constexpr int kPipelineGroups = 5;
inline constexpr const char* kPipelineGroupNames[kPipelineGroups] = {
    "qkv_linear", "core_attn", "attn_proj", "expert_fc1", "moe_act"};

// One step (forward over all layers, then backward) through `off`, on `ex`.
// Fills engine_host_ns (wall time inside PipelineOffloader calls) and pushes;
// the per-call arrays of StepCost stay zero. Dies on any engine error, with
// the layer, the group and the call in the message.
StepCost RunPipelineStep(Exec& ex, PipelineOffloader& off, const Shape& s);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_PIPELINE_STEP_H_
