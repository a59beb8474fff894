// Options, group states and statistics of the layer-mode Offloader
// (engine/offload.h), in a header of their own so that the Offloader's
// internal pieces can use them.

#ifndef OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
#define OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_

#include <cstdint>
#include <optional>

#include "engine/backend.h"
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

// Life cycle of one layer's group (SPEC §3).
enum class GroupState {
  kNotOffloaded,     // collecting pushes, or never offloaded
  kOffloadStarted,   // copies to host enqueued
  kOffloadFinished,  // device memory released; host copy complete or pending
  kReloadStarted,    // copies back enqueued; pops wait per span
  kReleased,         // after the group's backward: nothing held
  // StartOffload could not offload (no pinned memory, or a copy could not
  // be enqueued): the tensors stay on device and pop as pushed; the
  // group's ReleaseForwardMemory and StartReload are no-ops.
  kKeptOnDevice,
};

// "not_offloaded", "offload_started", ...
const char* GroupStateName(GroupState state);

struct OffloaderStats {
  int64_t tensors_offloaded = 0;  // pushed into an offloaded group
  int64_t tensors_kept = 0;       // passed through (small, flagged, ...)
  int64_t spans_offloaded = 0;    // D2H span copies enqueued
  int64_t bytes_offloaded = 0;    // D2H bytes enqueued
  int64_t bytes_reloaded = 0;     // H2D bytes enqueued
  int64_t views_made_contiguous = 0;
  // Bytes copied to host whose device storage stays alive because the
  // caller still holds it (offloading them saved no memory; SPEC §2.5).
  int64_t bytes_retained_by_caller = 0;
  int64_t pinned_allocations = 0;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_OFFLOAD_OPTIONS_H_
