// Layer scheduling: when each offloaded layer's memory is released and when
// its reload starts (SPEC §4.1, §4.2). The design doc's synchronization_dict.

#ifndef OFFLOAD_ENGINE_SCHEDULE_H_
#define OFFLOAD_ENGINE_SCHEDULE_H_

#include <map>

#include "engine/status.h"

namespace offload {

// The most layers a model may have: step numbers (up to twice this) never
// overflow, and no real model comes near it.
inline constexpr int kMaxModelLayers = 1 << 20;

// For one offloaded layer: its offload must finish (device memory released)
// once `offload_num` layers have begun their forward (offload_fwd) or their
// backward (!offload_fwd); its reload starts once `reload_num` layers have
// begun their forward (reload_fwd) or backward (!reload_fwd).
struct ScheduleEntry {
  bool offload_fwd = true;
  int offload_num = 0;
  bool reload_fwd = false;
  int reload_num = 0;

  friend bool operator==(const ScheduleEntry&, const ScheduleEntry&) = default;
};

// Layer id -> entry. A layer is offloaded iff it is a key.
using ScheduleTable = std::map<int, ScheduleEntry>;

// The default schedule (SPEC §4.1): the first `offloaded` of `layers` layers;
// layer i is released before the forward of layer layers-offloaded+i and
// reloaded when the backward of layer layers-1-offloaded+i begins.
// Errors: kInvalidArgument unless 0 <= offloaded <= layers - 1 and
//   layers <= kMaxModelLayers.
StatusOr<ScheduleTable> DefaultSchedule(int layers, int offloaded);

// The steps of one iteration in order: the forward of layer 0..n-1 begins at
// step 1..n, then the backward of layer n-1..0 begins at step n+1..2n.
// `fwd`/`num` pairs of a ScheduleEntry name a step: StepOf(true, c) = c,
// StepOf(false, c) = n + c.
// REQUIRES: 0 <= layers, count <= kMaxModelLayers (never overflows then).
int ScheduleStep(int layers, bool forward, int count);

// Checks a table for `layers` layers: ids in [0, layers); counts in
// [1, layers]; the release comes after the layer's own forward begins, the
// reload no earlier than the release and no later than the layer's own
// backward. Errors: kInvalidArgument naming the layer and the rule broken,
// or for layers outside [1, kMaxModelLayers].
Status ValidateSchedule(const ScheduleTable& table, int layers);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_SCHEDULE_H_
