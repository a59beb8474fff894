// What bindings.cc (the module), loop_binding.cc (the TrainingLoop) and
// plan_binding.cc (the joint planner) share.

#ifndef ACTOFFLOAD_CSRC_LOOP_BINDING_H_
#define ACTOFFLOAD_CSRC_LOOP_BINDING_H_

#include <torch/csrc/utils/pybind.h>

#include <memory>

#include "engine/backend.h"
#include "engine/offload_stats.h"

namespace actoffload {

// Adds actoffload._C.TrainingLoop, LoopRef and LoopHandle to `m`.
void BindTrainingLoop(pybind11::module& m);

// Adds actoffload._C.plan_joint, evaluate_joint, smallest_joint_budget,
// joint_limit and JointRace (plan_binding.cc).
void BindJointPlan(pybind11::module& m);

// The event of a ReadyEvent object (TE's start_offload).
std::shared_ptr<offload::Event> ReadyEventOf(const pybind11::handle& object);

// OffloaderStats as a dict, for Python.
inline pybind11::dict StatsDict(const offload::OffloaderStats& stats) {
  pybind11::dict out;
  out["tensors_offloaded"] = stats.tensors_offloaded;
  out["tensors_kept"] = stats.tensors_kept;
  out["spans_offloaded"] = stats.spans_offloaded;
  out["bytes_offloaded"] = stats.bytes_offloaded;
  out["bytes_reloaded"] = stats.bytes_reloaded;
  out["views_made_contiguous"] = stats.views_made_contiguous;
  out["bytes_retained_by_caller"] = stats.bytes_retained_by_caller;
  out["pinned_allocations"] = stats.pinned_allocations;
  return out;
}

}  // namespace actoffload

#endif  // ACTOFFLOAD_CSRC_LOOP_BINDING_H_
