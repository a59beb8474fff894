// The joint plan's problem (engine/plan/joint_plan.h) for the options of
// the layer-mode Offloader (engine/offload_options.h): what the Offloader
// plans with at Create when OffloadOptions::recompute is set, and what a
// caller (bench/) plans with to see that plan before creating one.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_OF_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_OF_H_

#include "engine/offload_options.h"
#include "engine/plan/joint_plan.h"

namespace offload {

// The joint plan's problem for `options` (SPEC §4.8): the declared layers,
// bandwidths and allow_offload of options.recompute, the budget of
// activation_budget_bytes. The Offloader plans with it at Create; a caller
// may plan with it too (PlanJoint) to see the plan before creating one.
inline JointProblem JointProblemOf(const OffloadOptions& options) {
  JointProblem p;
  if (options.recompute.has_value()) {
    p.units = options.recompute->layers;
    p.d2h_gbps = options.recompute->d2h_gbps;
    p.h2d_gbps = options.recompute->h2d_gbps;
    p.allow_offload = options.recompute->allow_offload;
  }
  p.budget = options.activation_budget_bytes.value_or(0);
  return p;
}

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_OF_H_
