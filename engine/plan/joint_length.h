// The budget's plan for a batch longer than the one profiled (SPEC §7.8):
// dynamic padding feeds batches of many lengths, and the warm-up race
// (joint_race.h) measured one. Every byte a unit saves, holds for a moment
// or re-creates, and every time it takes, grows with the batch's tokens
// (SDPA's and the MLP's activations are linear in them), so a batch
// `ratio` times the profiled one's size is the race's units scaled by
// `ratio`, the bytes beside them too, within the same budget; where a
// checked step measured the units' bytes growing faster (eager attention's
// scores grow as the square of the tokens), their bytes are scaled by
// `ratio` to the race's length_exponent(). A shorter batch gets the race's
// plan lightened for its scaled-down units (PlanForShorter). Pure, as the
// race is, but for the race's length state the functions below that take it
// mutable set.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_LENGTH_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_LENGTH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race.h"

namespace offload {

// `unit` for a batch `ratio` times the profiled one's size: its bytes
// (saved, input, re-created and transient ones) and times scaled, rounded
// to the nearest byte and kept at least 1 where they were positive.
UnitCost ScaledUnit(const UnitCost& unit, double ratio);
// The same, its bytes scaled by `bytes_ratio` and its times by `time_ratio`.
UnitCost ScaledUnit(const UnitCost& unit, double bytes_ratio, double time_ratio);

// Whether two plans run alike: the same choice per unit, and the same
// places for each offloaded unit's release and reload (the schedule).
bool SameSchedule(const JointPlan& a, const JointPlan& b);

struct LengthPlan {
  JointPlan plan;
  // The scaled units and the budget the plan was made for (its text's).
  JointProblem problem;
  // 0 where the plan fits the budget; else the least whole-step budget
  // any plan fits at this length (the plan is the one for it).
  int64_t needs_budget = 0;
};

// The plan for a batch `ratio` times the profiled one's size, within the
// race's budget: the units' budget less what the bytes beside the units
// grow by. The plan in force where it still fits that (no change for the
// caller), else the joint plan for it, else the plan for the smallest
// units' budget any plan fits, with needs_budget naming that budget as a
// whole step's.
// Errors: kInvalidArgument where ratio < 1 or not finite; kResourceExhausted
//   where no plan fits at any budget (a unit's own bytes exceed every
//   bound the planner tries).
// REQUIRES: race.Start() succeeded.
StatusOr<LengthPlan> PlanForLength(const JointRace& race, double ratio);

// The plan for a batch `ratio` (0 < ratio < 1) times the profiled one's
// size, shorter: the race's units with their bytes and times scaled by
// `ratio` (bytes that grow with the tokens as fast as they do or faster
// shrink at least so), within the race's units' budget (the bytes beside
// the units are not taken to shrink). From the race's own plan, which the
// warm-up measured, its re-run units (recomputed or selective) are no
// longer re-run one at a time, the one that lowers the predicted step most
// first, while the units fit: a lighter plan, never one that re-runs a unit
// the race's does not. None where that changes nothing, or where the
// race's plan does not fit the scaled units: the race's plan serves.
// Errors: kInvalidArgument where ratio is not in (0, 1).
// REQUIRES: race.Start() succeeded.
// Why: a batch shorter than the profiled one ran the race's plan, made for
// the profiled length: on Llama h4096 (GPU run 163) at 1024 tokens, 1.39 of
// its plain step, where 2048 tokens ran the same plan at 1.13.
StatusOr<std::optional<LengthPlan>> PlanForShorter(const JointRace& race, double ratio);

// The peak the units reach with `choice` at a batch `ratio` times the
// profiled one's size, as the race's model predicts it with the bytes'
// growth it knows (whatever the budget: an offloaded unit released where
// none needs its room).
// Errors: kInvalidArgument where ratio < 1 or not finite, or `choice` does
//   not match the race's units (EvaluateJoint's).
// REQUIRES: race.Start() succeeded.
StatusOr<int64_t> PeakAtLength(const JointRace& race, double ratio,
                               const std::vector<UnitChoice>& choice);

// After the warm-up, a step of the plan PlanForLength made for `ratio`,
// predicted to peak at `failed_peak_bytes` (its plan.peak_bytes), ran out
// of device memory: the device holds less than the model says it does.
// Returns the plan for that length predicted below it, and lowers the
// race's units' budget to what that plan was made within (the failed
// plan's peak less options().length_step of it, at least one byte, plus
// what the bytes beside the units grow by; and by the margin at least),
// so that later plans for longer batches are made within it too.
// Errors: those of PlanForLength; kResourceExhausted where no plan for
//   that length is predicted below `failed_peak_bytes` (it was the
//   smallest). On error the race is unchanged.
// REQUIRES: race.Start() succeeded.
StatusOr<LengthPlan> PlanForLengthBelow(JointRace& race, double ratio,
                                        int64_t failed_peak_bytes);

// After the warm-up, a step of the plan PlanForLength made for `ratio`,
// predicted to peak at `predicted_peak_bytes` in its units (its
// plan.peak_bytes; `needs_budget` its needs_budget), measured
// `measured_peak_bytes` above the forward's start on a batch of that length
// (the step's peak as the user reads it). Where that is within the budget
// (or needs_budget, where larger) and the tolerance, returns no plan: it
// holds. Else the units' bytes grew faster than the model took them to:
// the race's length_exponent() is raised to what the step measured (the
// plan's units at the profiled size, grown to the measured peak less the
// bytes beside them), and the plan for that length made with it is
// returned, with needs_budget where none fits the budget at that growth.
// Where the checked plan was the smallest, that is its own choice again,
// needing more than it was said to.
// Errors: kInvalidArgument where ratio <= 1 or not finite; those of
//   PlanForLength.
// REQUIRES: race.Start() succeeded.
// Why: on an H200 (GPU runs 134, 135) the plan for batches 1.25 times the
// profiled one's size was predicted at 448 MB with the bytes beside the
// units, and peaked at 562-566 MB against a budget of 480 MB, with no error.
// Lowering the plan by that excess (run 139) left the peak where it was:
// eager attention's bytes grow faster than the tokens, and a layer's
// re-run, not an offset, held it.
StatusOr<std::optional<LengthPlan>> PlanForLengthMeasured(
    JointRace& race, double ratio, int64_t predicted_peak_bytes,
    int64_t needs_budget, int64_t measured_peak_bytes);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_LENGTH_H_
