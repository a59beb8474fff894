// Options of the layer-mode Offloader (engine/offload.h), in a header of
// their own so that its policies can use them without the front door.

#ifndef OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
#define OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend.h"
#include "engine/device_bytes_probe.h"
#include "engine/offload_stats.h"  // GroupState, OffloaderStats
#include "engine/schedule.h"
#include "engine/unit_cost.h"

namespace offload {

// SPEC §4.8: what the caller declares so that the byte budget may also
// recompute layers (engine/plan/joint_plan.h, planned from these by
// JointProblemOf, engine/plan/joint_problem_of.h; docs/engine.md,
// "Recompute").
struct RecomputeOptions {
  // Per layer, in forward order: its saved bytes, forward and backward
  // times, and whether and at what cost the caller can recompute it.
  std::vector<UnitCost> layers;
  // The pinned copy bandwidths the plan assumes, GB/s.
  double d2h_gbps = 0;
  double h2d_gbps = 0;
  // false: recompute only (checkpointing); nothing is offloaded.
  bool allow_offload = true;
};

struct OffloadOptions {
  bool enabled = true;
  int model_layers = 1;            // TE model_layers
  int offloaded_layers = 1;        // TE num_layers (default scheduling)
  bool manual_synchronization = false;
  bool retain_pinned_buffers = false;
  int64_t min_offload_elements = 256 * 1024;
  std::optional<ScheduleTable> schedule;  // design doc's synchronization_dict

  // Extensions.
  // A span (the bytes of one storage that a group's views reach) is copied
  // whole when its views cover at least this fraction of it (SPEC §2.2).
  double min_span_coverage = 0.5;
  // Sparser views are made contiguous on the compute stream (default) or,
  // with this set, not offloaded. Both warn.
  bool skip_sparse_views = false;
  // Manual synchronization only: copies in both directions run on this
  // stream instead of the Offloader's own D2H and H2D streams.
  Stream* offload_stream = nullptr;
  // Echo warnings to stderr as well as to diagnostics().
  bool warnings_to_stderr = false;
  // SPEC §4.7: instead of k of n layers, keep the device bytes of saved
  // tensors that may be offloaded within this budget. The first iteration
  // runs without offloading and is recorded; the plan made from it
  // (engine/plan/budget_plan.h, Offloader::BudgetPlanText) drives the
  // iterations after it. offloaded_layers is then ignored. Excludes
  // manual_synchronization and a schedule table.
  std::optional<int64_t> activation_budget_bytes;
  // With activation_budget_bytes: plan for the smallest budget any plan can
  // keep for the recorded iteration when that is more (torchtune's "offload
  // every activation"). Without it, such a budget is refused once: the
  // FinishBackward that plans returns kResourceExhausted naming the
  // smallest that fits, and plans for that.
  bool smallest_budget = false;
  // With activation_budget_bytes: the caller's count of device bytes in
  // use (SPEC §4.7), not owned; it must outlive the Offloader. The recorded
  // iteration then notes, at each push and backward call, the bytes in use
  // that the engine's saved tensors do not account for (above those at the
  // forward's first push), and the plan keeps them within the budget too
  // (BudgetRecording::forward_outside, held_outside). nullptr: the budget
  // covers saved tensors only.
  DeviceBytesProbe* device_bytes_probe = nullptr;
  // SPEC §4.8, with activation_budget_bytes: at Create the Offloader plans
  // per layer keep / offload / recompute for the least predicted step
  // within the budget (PlanJoint); Offloader::Recompute(layer) says which
  // layers the caller recomputes. Create fails if no plan fits.
  std::optional<RecomputeOptions> recompute;
  // SPEC §7.3, for callers whose graphs may be traversed more than once
  // (PyTorch's retain_graph): a layer's host copy stays until the
  // iteration ends (FinishBackward or AbandonIteration) instead of going
  // when the next layer's backward begins, so that EndTraversal can let a
  // later backward pass reload it again. Device memory is released as
  // without it. With activation_budget_bytes, a later traversal follows
  // the plan's reloads and frees again from its first call.
  bool keep_host_copies = false;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
