// Options of the layer-mode Offloader (engine/offload.h), in a header of
// their own so that its policies can use them without the front door.

#ifndef OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
#define OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_

#include <cstdint>
#include <optional>

#include "engine/backend.h"
#include "engine/offload_stats.h"  // GroupState, OffloaderStats
#include "engine/schedule.h"

namespace offload {

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
  // (engine/budget/budget_plan.h, Offloader::BudgetPlanText) drives the
  // iterations after it. offloaded_layers is then ignored. Excludes
  // manual_synchronization and a schedule table.
  std::optional<int64_t> activation_budget_bytes;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
