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
//
// RunPipelineSchedule runs several microbatches, each a chunk (stage 0,
// microbatch m) of the same layers on the same input, in the order of a
// pipeline rank's schedule (OneFOneB: rank 0 of `pp` ranks, Megatron's
// 1F1B, e.g. F0 F1 B0 F2 B1 F3 B2 B3 for pp = 2 and 4 microbatches), then
// FinishIteration(). Weight gradients are overwritten, not accumulated, by
// each microbatch's backward (the same on every configuration).
//
// The GEMMs are RunStep's (layer_gemms.h: ForwardGemm, InputGradGemm,
// WeightGradGemm, GradientsOf), so both front doors run the same work. The
// loop stays apart from workload/layer_loop.h's RunLayerStep, the one loop of
// the layer-mode steps (RunStep, the workload driver, testing/graph_step.h),
// because it drives another protocol: RunLayerStep makes the Offloader's
// ForwardStep / BackwardStep / FinishBackward calls, one forward and one
// backward per layer; the PipelineOffloader wants StartChunk per chunk,
// GroupStart / GroupCommit per group inside a layer, GroupBackwardStart /
// GroupBackwardEnd around each group's pops, and one FinishIteration after
// the forwards and backwards of several chunks interleaved by a schedule.
// It also stays apart from workload/pipeline_driver.h's RunPipelineRank,
// whose schedule it uses (OneFOneB is its RankSchedule): that driver runs
// Megatron's nested groups with release_tensors and checks every popped
// byte through the workload hooks, for tests; this runs the benchmark's
// GEMMs on an Exec and is timed.

#ifndef OFFLOAD_BENCH_PIPELINE_STEP_H_
#define OFFLOAD_BENCH_PIPELINE_STEP_H_

#include <vector>

#include "bench/layer_stack.h"
#include "engine/pipeline_offload.h"
#include "workload/pipeline_driver.h"

namespace offload::bench {

// The group names, in commit order within a layer.
inline constexpr int kPipelineGroups = 5;
inline constexpr const char* kPipelineGroupNames[kPipelineGroups] = {
    "qkv_linear", "core_attn", "attn_proj", "expert_fc1", "moe_act"};

// The steps of pipeline rank 0 of `pp` ranks over `microbatches` (1F1B, one
// virtual stage). REQUIRES: pp >= 1, microbatches >= 1.
std::vector<PipelineStep> OneFOneB(int pp, int microbatches);

// One iteration of `schedule` (forward and backward steps of chunks of
// stage 0) through `off`, on `ex`; OneFOneB(1, 1) is one step of one chunk
// (forward over all layers, then backward). Fills engine_host_ns (wall time
// inside PipelineOffloader calls) and pushes; the per-call arrays of
// StepCost stay zero. Dies on any engine error, with the layer, the group
// and the call in the message. REQUIRES: each chunk's forward comes before its
// backward, and microbatches are distinct.
StepCost RunPipelineSchedule(Exec& ex, PipelineOffloader& off, const Shape& s,
                             const std::vector<PipelineStep>& schedule);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_PIPELINE_STEP_H_
