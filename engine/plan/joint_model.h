// Private to the joint plan's library (engine/plan/joint_plan.h) and its
// limit (joint_limit.h): the model's per-unit rules shared by its
// evaluation (joint_model.cc, EvaluateJoint), its searches (joint_plan.cc,
// PlanJoint and SmallestJointBudget) and the limit's bound, which counts
// bytes as the model does. Not for callers.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_MODEL_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "engine/plan/joint_plan.h"

namespace offload {
namespace joint_internal {

inline std::string UnitName(int unit) { return "unit " + std::to_string(unit); }

inline std::string Bytes(int64_t b) { return std::to_string(b) + " bytes"; }

// Whether the unit re-runs its cheap ops only (its saved bytes kept or
// offloaded).
inline bool IsSelective(UnitChoice c) {
  return c == UnitChoice::kSelective || c == UnitChoice::kSelectiveOffload;
}

// Whether the unit re-runs (fully or selectively) before its backward.
inline bool ReRuns(UnitChoice c) {
  return c == UnitChoice::kRecompute || IsSelective(c);
}

// Whether the forward rule may release it: kept or selective-offload.
inline bool Releasable(UnitChoice c) {
  return c == UnitChoice::kKeep || c == UnitChoice::kOffload ||
         c == UnitChoice::kSelectiveOffload;
}

// The bytes a released unit sends to host and brings back: its saved
// bytes; selective-offload, its selective bytes but its input (the
// checkpoint holds it on device for the re-run).
inline int64_t HostBytes(const UnitCost& u, UnitChoice c) {
  if (c == UnitChoice::kSelectiveOffload) {
    return std::max<int64_t>(0, u.selective_bytes - u.input_bytes);
  }
  return u.saved_bytes;
}

// The bytes it saves in the forward, when not offloaded, under `c` (only
// the re-run kinds matter).
inline int64_t ForwardBytes(const UnitCost& u, UnitChoice c) {
  if (c == UnitChoice::kRecompute) return u.input_bytes;
  if (IsSelective(c)) return u.selective_bytes;
  return u.saved_bytes;
}

// The bytes its re-run re-creates and holds until its backward ends.
inline int64_t RecreatedBytes(const UnitCost& u, UnitChoice c) {
  if (c == UnitChoice::kRecompute) return u.recompute_bytes;
  if (IsSelective(c)) return u.saved_bytes - u.selective_bytes;
  return 0;
}

// What it holds for a moment at its forward's peak, above ForwardBytes.
inline int64_t ForwardTransient(const UnitCost& u, UnitChoice c) {
  if (c == UnitChoice::kRecompute) {
    return std::max(u.forward_transient_bytes,
                    u.recompute_forward_transient_bytes);
  }
  if (IsSelective(c)) {
    return std::max(u.forward_transient_bytes,
                    u.selective_forward_transient_bytes);
  }
  return u.forward_transient_bytes;
}

// What it holds for a moment at its backward's peak, above what is on
// device then (RecreatedBytes included): its backward's temporaries or,
// when it re-runs, its re-run's transient if larger (the re-run ends
// before the backward starts, so the two do not coexist); a selective
// unit's, where measured, if larger still.
inline int64_t BackwardTransient(const UnitCost& u, UnitChoice c) {
  if (!ReRuns(c)) return u.backward_transient_bytes;
  const int64_t most =
      std::max(u.backward_transient_bytes, u.forward_transient_bytes);
  if (IsSelective(c)) {
    return std::max(most, u.selective_backward_transient_bytes);
  }
  return most;
}

// The time its re-run adds before its backward.
inline double ReRunNs(const UnitCost& u, UnitChoice c) {
  if (c == UnitChoice::kRecompute) return u.recompute_ns;
  if (IsSelective(c)) return u.selective_ns;
  return 0;
}

}  // namespace joint_internal
}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_MODEL_H_
