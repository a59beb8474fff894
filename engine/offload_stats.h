// What both front doors report about their groups: the life cycle of a
// group (GroupState) and the counters of OffloaderStats. Shared by the
// layer mode (engine/offload.h), the fine-grained mode
// (engine/pipeline_offload.h) and the mechanism of engine/core.

#ifndef OFFLOAD_ENGINE_OFFLOAD_STATS_H_
#define OFFLOAD_ENGINE_OFFLOAD_STATS_H_

#include <cstdint>

namespace offload {

// Life cycle of one offload group: a layer's, a byte-budget unit's or a
// named group's (SPEC §3).
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

#endif  // OFFLOAD_ENGINE_OFFLOAD_STATS_H_
