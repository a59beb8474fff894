// The joint plan (SPEC §4.8): for a memory budget, choose per unit (a layer)
// whether its saved tensors stay on the device, go to host and come back
// (the byte budget of SPEC §4.7), are not saved at all and recomputed
// by the caller right before the unit's backward, or, selective recompute,
// are saved only in part (its input and its costly ops' outputs: matmuls,
// attention) with the cheap ops (norms, activations, softmax) re-run by the
// caller's selective-checkpoint policy right before its backward. Pure data and functions:
// no backend, no engine state. The Offloader makes this plan at Create when
// OffloadOptions::recompute is set (engine/offload.h: Recompute(layer));
// bench/ also calls it directly (checkpoint-only rows).
//
// The model the plan predicts with (units in forward order; the backward
// runs them in reverse, one at a time, on one compute stream; one copy
// engine each way):
//  - Forward. Unit i's saved bytes (saved_bytes, or input_bytes when
//    recomputed, or selective_bytes when selective) arrive evenly while its
//    forward runs; at its peak it also holds forward_transient_bytes (when
//    recomputed, recompute_forward_transient_bytes if larger; when
//    selective, selective_forward_transient_bytes if larger), so saved plus
//    transient must fit in the budget next to what is on device. Where they would not, the earliest
//    offloadable units not yet released and not re-run (fully or
//    selectively; but for kSelectiveOffload ones) are released,
//    earliest first (the byte budget's rule, engine/plan/budget_plan.h),
//    and the compute stream waits there for their copies to host: at the
//    fraction of the forward where what is on device plus the part of saved
//    plus transient produced so far reaches the budget. After the forward
//    only the saved bytes stay (the transient is gone). A released unit's
//    copy runs at d2h_gbps from its forward's start (after the copies
//    queued before it) and ends no earlier than its forward. It copies its
//    saved bytes or, kSelectiveOffload, its selective_bytes less its
//    input_bytes, which stay on device (its checkpoint holds its input).
//  - Backward. A recomputed unit holds recompute_bytes more while its
//    backward runs and takes recompute_ns longer; a selective one holds
//    saved_bytes - selective_bytes more (what its cheap ops re-create) and
//    takes selective_ns longer. On top of what is on device while a unit's
//    backward runs, its peak holds backward_transient_bytes, or, when
//    recomputed or selective, the larger of that and
//    forward_transient_bytes (its re-run ends before its backward starts,
//    so the two do not coexist) and, when selective,
//    selective_backward_transient_bytes; that peak must fit in the budget. Where
//    it would not (a backward needing more room than the forward did), the
//    next offloadable units in the forward's order (not the last) are
//    released too, at the forward's end, until every peak fits.
//    Released units come back in order of need, each as early as the
//    budget allows over the whole time it is then on device (it must fit
//    next to every later unit's peak until its own backward), at
//    h2d_gbps; a unit's backward waits for its own reload.
// The model is coarser than the engine (fluid bytes instead of tensors,
// whole units in the backward); the engine's byte budget then picks the
// storages to offload from its recorded iteration, within the budget.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_PLAN_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/status.h"
#include "engine/unit_cost.h"

namespace offload {

// kSelectiveOffload: selective, and its saved bytes (but for its input,
// which its re-run reads) go to host and come back before its backward, as
// an offloaded unit's do: fewer bytes to copy for the re-run of its cheap
// ops. As an input to EvaluateJoint, a selective unit the forward rule may
// release; in a plan, one it released (one it did not is kSelective).
enum class UnitChoice { kKeep, kOffload, kRecompute, kSelective, kSelectiveOffload };
// "keep", "offload", "recompute", "selective", "selective-offload".
const char* UnitChoiceName(UnitChoice c);

struct JointProblem {
  std::vector<UnitCost> units;  // in forward order (engine/unit_cost.h)
  double d2h_gbps = 0;          // pinned copy bandwidth, GB/s (1e9 B/s)
  double h2d_gbps = 0;
  int64_t budget = 0;           // bytes
  // Restrict the choices: offload-only (the byte budget, §4.7) or
  // recompute-only (checkpointing). allow_recompute covers selective
  // recompute too.
  bool allow_offload = true;
  bool allow_recompute = true;
};

struct JointPlan {
  std::vector<UnitChoice> choice;  // per unit
  // Predicted by the model above.
  double step_ns = 0;
  double stall_ns = 0;       // compute-stream waits for copies
  double recompute_ns = 0;   // forward re-run of the recomputed units
  double selective_ns = 0;   // cheap ops' re-run of the selective units
  int64_t peak_bytes = 0;    // the most bytes on device at once, transients too
  int64_t offloaded_bytes = 0;
  // Where the model moves each offloaded unit, -1 for the others: the unit
  // during whose forward its device bytes are released (the first unit that
  // needs the room), and the unit whose backward is running when its reload
  // starts. A caller's schedule (SPEC §4.2) follows these.
  std::vector<int> released_during;
  std::vector<int> reloaded_during;

  // Whether the unit is recomputed in full (kRecompute only).
  bool Recompute(int unit) const {
    return choice[unit] == UnitChoice::kRecompute;
  }
  // Whether the unit is selective (its saved bytes offloaded or not).
  bool Selective(int unit) const {
    return choice[unit] == UnitChoice::kSelective ||
           choice[unit] == UnitChoice::kSelectiveOffload;
  }
};

// Assignments of {none, recompute, selective, selective-offload where the
// unit is offloadable and the problem allows offloading} to the
// recomputable units
// that PlanJoint and SmallestJointBudget try one by one; with more they
// search greedily (PlanJoint) or binary-search PlanJoint (the budget).
// 2^16: sixteen units without selective, ten with, eight with
// selective-offload too.
inline constexpr int64_t kJointExhaustiveAssignments = 65536;

// The plan with the least predicted step time among those that fit the
// budget. Ties go to fewer re-run units (recomputed or selective), then to
// the lower peak (the most room for the model's error: which units
// recompute changes what the backward holds), then to fewer offloaded
// bytes, then to fewer fully recomputed units (selective over full: less
// re-run work to mispredict).
// It tries every assignment of {none, recompute, selective and
// selective-offload where the unit allows them} to the recomputable units
// when there are at most
// kJointExhaustiveAssignments; with more, it grows the set greedily one
// unit per round (the unit and kind, full or selective, giving the least
// step) from none to all, keeps the best plan seen (every unit re-run in
// full, and selectively where it may, are seen too), then turns its full
// re-runs selective one at a time while that makes it better.
// Errors: kInvalidArgument for a malformed problem (ValidateJointProblem);
//   kResourceExhausted naming the budget and the smallest bytes any plan
//   allowed needs, when none fits.
StatusOr<JointPlan> PlanJoint(const JointProblem& problem);

// The least budget for which PlanJoint succeeds. `problem.budget` is
// ignored. For each assignment of re-runs (recompute, selective) PlanJoint
// tries, success is monotone in the budget (EvaluateJoint sends to host at
// the forward's end what a later backward's peak needs gone, so a budget
// large enough for the forward to keep a unit is never refused where a
// smaller one, which releases it, fits): the least over a binary search of
// each. With more than kJointExhaustiveAssignments (PlanJoint's greedy
// search, whose sets depend on the budget) it binary-searches PlanJoint
// itself: a budget that fits where one byte less does not.
// Errors: kInvalidArgument for a malformed problem (the budget aside).
StatusOr<int64_t> SmallestJointBudget(const JointProblem& problem);

// The prediction for the given choice: only kRecompute, kSelective and
// kSelectiveOffload matter (kept and offloaded units follow from the
// forward rule above, as do selective units released or not).
// Errors: kInvalidArgument for a malformed problem, a choice of another
//   size, a recomputed unit that is not recomputable, a selective one that
//   is not selective, or either where the problem does not allow
//   recompute (naming the unit), a selective-offload one that is not
//   offloadable or where the problem does not allow offloading;
//   kResourceExhausted naming the unit where
//   the budget does not fit.
StatusOr<JointPlan> EvaluateJoint(const JointProblem& problem,
                                  const std::vector<UnitChoice>& choice);

// The same, `recompute[i]` true for a unit recomputed in full.
StatusOr<JointPlan> EvaluateJoint(const JointProblem& problem,
                                  const std::vector<bool>& recompute);

// Checks sizes and values: at least one unit, bytes (transients too) and
// times not negative, saved_bytes > 0, input bytes within saved_bytes for
// a recomputable unit, a selective unit recomputable with
// selective_bytes in (0, saved_bytes], selective_ns finite and not
// negative, positive bandwidths where offloading is allowed, budget > 0.
// Errors: kInvalidArgument naming the unit and the field.
Status ValidateJointProblem(const JointProblem& problem);

// Checks `plan` against `problem` independently of PlanJoint: its choices
// are allowed and its figures are what EvaluateJoint predicts for them.
// Errors: kInvalidArgument naming the unit or the figure.
Status ValidateJointPlan(const JointPlan& plan, const JointProblem& problem);

// A table: one row per unit (bytes, times, choice), then the predicted
// step, stalls, recompute, offloaded bytes and the peak against the budget.
// Where a unit may be selective, a selective_ms column and the selective
// re-run's total too.
std::string FormatJointPlan(const JointPlan& plan,
                            const JointProblem& problem);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_PLAN_H_
