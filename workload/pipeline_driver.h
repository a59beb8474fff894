// A pipeline driver: runs one pipeline rank's schedule of a transformer-like
// model through a PipelineOffloader on any Backend, the way Megatron's
// fine-grained hooks are driven, and checks every tensor Pop returns.
//
// Schedule (RankSchedule): 1F1B for one virtual stage, interleaved 1F1B for
// several, as Megatron orders them: pp ranks, vpp virtual stages, m
// microbatches (a multiple of pp when vpp > 1).
//
// Each chunk runs `layers` layers; a layer is (SPEC §5.1)
//   attn_norm { x; qkv_linear { ln } core_attn { q, k, v views of qkv }
//               attn_proj { attn_out }  residual add }   release x
//   mlp_norm  { h; expert_fc1 { ln2 } moe_act { fc1_out; act_out (fc2's
//               input: moe_act commits after fc2) }  residual add } release h
// with core_attn releasing qkv and attn_proj releasing attn_out. A layer's
// output is the next layer's input. Every activation is made with fresh
// pattern bytes (MakeTensorFn), written by a forward compute call whose
// duration is proportional to its bytes, and dropped by the driver after
// its last use, so that only the offloader's references keep it (as with
// autograd). Backward replays the forward's group events in reverse:
// a commit becomes GroupBackwardStart (then the group's tensors are popped,
// read by a backward compute call and captured), a start GroupBackwardEnd.
// After FinishIteration the compute stream is synchronized and every
// captured byte compared.
//
// Compute calls name their group and chunk, for timelines and hazard
// reports: "L0.input_norm [attn_norm of chunk (stage 0, microbatch 1)]"
// in forward (the innermost open group), "backward L0.core_attn
// [core_attn of chunk (stage 0, microbatch 1)]" in backward.

#ifndef OFFLOAD_WORKLOAD_PIPELINE_DRIVER_H_
#define OFFLOAD_WORKLOAD_PIPELINE_DRIVER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/pipeline_offload.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "workload/workload.h"

namespace offload {

struct PipelineSpec {
  int pp = 1;            // pipeline ranks
  int vpp = 1;           // virtual stages per rank
  int microbatches = 1;  // per iteration
  int layers = 1;        // per chunk
  int64_t tokens = 1024;
  int64_t hidden = 1024;
  int64_t ffn = 4096;  // expert_fc1 output width
  DType dtype = DType::kBF16;
  // Forward compute per MiB written; backward takes twice as long.
  int64_t compute_ns_per_mib = 20000;
};

// OK if the spec can be scheduled. Errors: kInvalidArgument naming the
// field (sizes < 1, microbatches not a multiple of pp with vpp > 1).
Status ValidatePipelineSpec(const PipelineSpec& spec);

struct PipelineStep {
  bool forward = true;
  ChunkId chunk;
};

// The chunks `rank` runs forward and backward, in order.
// REQUIRES: ValidatePipelineSpec(spec) is OK, 0 <= rank < spec.pp.
std::vector<PipelineStep> RankSchedule(const PipelineSpec& spec, int rank);

struct PipelineRunOptions {
  int iterations = 2;
  bool check_bytes = true;
  // Called after each iteration's synchronization (e.g. to read memory
  // statistics), with the iteration's index.
  std::function<void(int iteration)> after_iteration;
  // Called just before (done = false) and after (done = true) each
  // GroupCommit, e.g. to attribute the copies it enqueues (timelines).
  std::function<void(int iteration, const ChunkId& chunk,
                     const std::string& group, bool done)>
      around_commit;
};

struct PipelineRankResult {
  int iterations = 0;
  int64_t tensors_checked = 0;
  int64_t bytes_checked = 0;
  std::vector<Mismatch> mismatches;  // layer = chunk index in the schedule
  // Device time of each iteration (with hooks.clock).
  std::vector<int64_t> iteration_ns;
  bool ok() const { return mismatches.empty(); }
};

// Runs `rank`'s schedule of `spec` for options.iterations iterations.
// Errors: kInvalidArgument for an invalid spec or rank, or no compute hook;
//   whatever the offloader, the hooks or the backend return (the message
//   names the iteration, chunk and call).
StatusOr<PipelineRankResult> RunPipelineRank(Backend& backend,
                                             PipelineOffloader& offloader,
                                             const PipelineSpec& spec,
                                             int rank,
                                             const WorkloadHooks& hooks,
                                             const PipelineRunOptions& options);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_PIPELINE_DRIVER_H_
