// FreezePlan: which groups the fine-grained mode keeps offloading after its
// warm-up iteration (SPEC §5.4). Pure: from what warm-up recorded to a
// decision per group.
//
// (a) Margin: for each group name, the last group of that name in the
//     earliest backward chunk that has one stays on device (so that the
//     reload of the next one runs a group ahead).
// (b) Pipeline-rank delta: rank × delta bytes stay on device: chunks in
//     backward order, groups in forward (commit) order, whole groups still
//     offloaded with bytes > 0, until the kept bytes reach the amount (at
//     most one group over).
// (c) Fraction: per chunk, of its n groups still offloaded with bytes > 0,
//     the latest floor(n·(1−f)) in forward order stay on device, with f
//     taken to six decimals and the floor computed in integers (upstream's
//     float floor keeps 0 instead of 1 for n = 5, f = 0.8).
// Groups warm-up did not offload, or that copied nothing, stay on device.

#ifndef OFFLOAD_ENGINE_PIPELINE_FREEZE_PLAN_H_
#define OFFLOAD_ENGINE_PIPELINE_FREEZE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/pipeline/chunk_order.h"
#include "engine/pipeline_summary.h"

namespace offload {

// What warm-up saw of one group.
struct RecordedGroup {
  std::string name;
  int ordinal = 0;         // among the chunk's groups of this name
  bool offloaded = false;  // warm-up offloaded it (its name was eligible)
  int64_t bytes = 0;       // bytes its copies to host moved
  int64_t caller_held_bytes = 0;  // of those, storages the caller kept
};

// One chunk's groups in commit order.
struct RecordedChunk {
  ChunkId id;
  std::vector<RecordedGroup> groups;
};

struct FreezeOptions {
  int pipeline_rank = 0;
  int64_t delta_bytes = 0;
  double fraction = 1.0;  // in [0, 1]
};

// decision[c][g]: chunk c (forward order) group g (commit order).
struct FrozenPlan {
  std::vector<std::vector<GroupDecision>> decision;
};

// REQUIRES: backward_order is a permutation of the chunk indices.
FrozenPlan FreezePlan(const std::vector<RecordedChunk>& chunks,
                      const std::vector<int>& backward_order,
                      const FreezeOptions& options);

// How many of `n` groups stay on device under fraction `f`: floor(n·(1−f))
// with f rounded to six decimals, in integer arithmetic.
int FractionKeptOnDevice(int n, double f);

// The per-name summary of a frozen plan for `pipeline_rank`.
OffloadSummary Summarize(const std::vector<RecordedChunk>& chunks,
                         const FrozenPlan& plan, int pipeline_rank);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_FREEZE_PLAN_H_
