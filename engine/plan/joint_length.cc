#include "engine/plan/joint_length.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

namespace offload {
namespace {

int64_t Scaled(int64_t bytes, double ratio) {
  if (bytes <= 0) return bytes;
  return std::max<int64_t>(std::llround(static_cast<double>(bytes) * ratio), 1);
}

}  // namespace

UnitCost ScaledUnit(const UnitCost& unit, double ratio) {
  return ScaledUnit(unit, ratio, ratio);
}

UnitCost ScaledUnit(const UnitCost& unit, double bytes_ratio, double time_ratio) {
  UnitCost u = unit;
  for (int64_t* bytes :
       {&u.saved_bytes, &u.input_bytes, &u.recompute_bytes,
        &u.forward_transient_bytes, &u.backward_transient_bytes,
        &u.recompute_forward_transient_bytes, &u.selective_bytes,
        &u.selective_forward_transient_bytes,
        &u.selective_backward_transient_bytes}) {
    *bytes = Scaled(*bytes, bytes_ratio);
  }
  for (double* ns :
       {&u.forward_ns, &u.backward_ns, &u.recompute_ns, &u.selective_ns}) {
    *ns *= time_ratio;
  }
  return u;
}

bool SameSchedule(const JointPlan& a, const JointPlan& b) {
  return a.choice == b.choice && a.released_during == b.released_during &&
         a.reloaded_during == b.reloaded_during;
}

namespace {

Status CheckRatio(double ratio) {
  if (!std::isfinite(ratio) || ratio < 1) {
    return InvalidArgumentError("plan for a longer batch: ratio " +
                                std::to_string(ratio) + " is not at least 1");
  }
  return OkStatus();
}

// The race's problem with its units' bytes scaled by `bytes_ratio` and
// their times by `time_ratio`, within `budget`.
JointProblem ScaledUnits(const JointRace& race, double bytes_ratio, double time_ratio,
                         int64_t budget) {
  JointProblem p;
  for (const UnitCost& u : race.units()) {
    p.units.push_back(ScaledUnit(u, bytes_ratio, time_ratio));
  }
  p.d2h_gbps = race.d2h_gbps();
  p.h2d_gbps = race.h2d_gbps();
  p.allow_offload = race.allow_offload();
  p.allow_recompute = race.allow_recompute();
  p.budget = budget;
  return p;
}

// The race's problem at a batch `ratio` times the profiled one's size,
// within the units' budget `units_budget` (the race's, or one lowered below
// it) less what the bytes beside the units grow by.
JointProblem ScaledProblem(const JointRace& race, double ratio,
                           int64_t units_budget) {
  const int64_t outside = Scaled(race.outside(), ratio);  // beside the units
  return ScaledUnits(race, std::pow(ratio, race.length_exponent()), ratio,
                     units_budget - (outside - race.outside()));
}

// PlanForLength within the units' budget `units_budget`.
StatusOr<LengthPlan> PlanWithin(const JointRace& race, double ratio,
                                int64_t units_budget) {
  LengthPlan out;
  JointProblem& p = out.problem;
  p = ScaledProblem(race, ratio, units_budget);
  const int64_t outside = Scaled(race.outside(), ratio);
  if (p.budget > 0) {
    if (StatusOr<JointPlan> same = EvaluateJoint(p, race.plan().choice);
        same.ok()) {
      out.plan = *std::move(same);
      return out;
    }
    if (StatusOr<JointPlan> plan = PlanJoint(p); plan.ok()) {
      out.plan = *std::move(plan);
      return out;
    }
  }
  StatusOr<int64_t> least = SmallestJointBudget(p);
  if (!least.ok()) return least.status();
  p.budget = *least;
  StatusOr<JointPlan> plan = PlanJoint(p);
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
  // As the whole step's budget: with what measurements took off the
  // units' budget (the model's error: JointRace::Lowered, LowerUnitsBudget).
  const int64_t lowered = std::max<int64_t>(
      0, static_cast<int64_t>(race.budget() * (1 - race.options().margin)) -
             race.outside() - race.units_budget());
  out.needs_budget = static_cast<int64_t>(std::ceil(
      static_cast<double>(*least + outside + lowered) /
      (1 - race.options().margin)));
  return out;
}

}  // namespace

StatusOr<int64_t> PeakAtLength(const JointRace& race, double ratio,
                               const std::vector<UnitChoice>& choice) {
  OFFLOAD_RETURN_IF_ERROR(CheckRatio(ratio));
  JointProblem p = ScaledProblem(race, ratio, race.units_budget());
  p.budget = std::numeric_limits<int64_t>::max() / 4;  // its peak, whatever it is
  OFFLOAD_ASSIGN_OR_RETURN(JointPlan plan, EvaluateJoint(p, choice));
  return plan.peak_bytes;
}

StatusOr<LengthPlan> PlanForLength(const JointRace& race, double ratio) {
  OFFLOAD_RETURN_IF_ERROR(CheckRatio(ratio));
  return PlanWithin(race, ratio, race.units_budget());
}

StatusOr<std::optional<LengthPlan>> PlanForShorter(const JointRace& race, double ratio) {
  if (!(ratio > 0 && ratio < 1)) {
    return InvalidArgumentError("plan for a shorter batch: ratio " + std::to_string(ratio) +
                                " is not between 0 and 1");
  }
  LengthPlan out;
  JointProblem& p = out.problem;
  p = ScaledUnits(race, ratio, ratio, race.units_budget());
  // From the race's plan, which ran: a re-run unit at a time no longer
  // re-run (kept, or offloaded where the model's forward rule says), the
  // one the model gains most by, while the step it predicts falls and the
  // units fit. Lighter plans only: none re-runs or offloads by choice a
  // unit the race's plan did not.
  StatusOr<JointPlan> plan = EvaluateJoint(p, race.plan().choice);
  if (!plan.ok()) return std::optional<LengthPlan>();  // (the race's plan serves)
  for (bool lighter = true; lighter;) {
    lighter = false;
    std::optional<JointPlan> best;
    for (size_t i = 0; i < plan->choice.size(); ++i) {
      const UnitChoice c = plan->choice[i];
      if (c != UnitChoice::kRecompute && c != UnitChoice::kSelective &&
          c != UnitChoice::kSelectiveOffload) {
        continue;
      }
      std::vector<UnitChoice> trial = plan->choice;
      trial[i] = UnitChoice::kKeep;
      StatusOr<JointPlan> t = EvaluateJoint(p, trial);
      if (t.ok() && t->step_ns < (best ? best->step_ns : plan->step_ns)) best = *std::move(t);
    }
    if (best.has_value()) {
      plan = *std::move(best);
      lighter = true;
    }
  }
  if (SameSchedule(*plan, race.plan())) return std::optional<LengthPlan>();
  out.plan = *std::move(plan);
  return std::optional<LengthPlan>(std::move(out));
}

StatusOr<LengthPlan> PlanForLengthBelow(JointRace& race, double ratio,
                                        int64_t failed_peak_bytes) {
  OFFLOAD_RETURN_IF_ERROR(CheckRatio(ratio));
  const int64_t growth = Scaled(race.outside(), ratio) - race.outside();
  const int64_t lowered = std::min(
      race.units_budget() -
          static_cast<int64_t>(race.budget() * race.options().margin),
      failed_peak_bytes -
          std::max<int64_t>(1, static_cast<int64_t>(
                                   failed_peak_bytes * race.options().length_step)) +
          growth);
  OFFLOAD_ASSIGN_OR_RETURN(LengthPlan out, PlanWithin(race, ratio, lowered));
  if (out.plan.peak_bytes >= failed_peak_bytes) {
    return ResourceExhaustedError(
        "plan for a batch " + std::to_string(ratio) +
        " times the profiled one's size: none is predicted below " +
        std::to_string(failed_peak_bytes) +
        " bytes, the peak of the one that ran out of memory (the smallest)");
  }
  race.LowerUnitsBudget(std::min(lowered, race.units_budget() - 1));
  return out;
}

StatusOr<std::optional<LengthPlan>> PlanForLengthMeasured(
    JointRace& race, double ratio, int64_t predicted_peak_bytes,
    int64_t needs_budget, int64_t measured_peak_bytes) {
  if (!std::isfinite(ratio) || ratio <= 1) {
    return InvalidArgumentError("checked plan for a longer batch: ratio " +
                                std::to_string(ratio) + " is not above 1");
  }
  if (measured_peak_bytes <= std::max(race.budget(), needs_budget) +
                                 race.options().tolerance_bytes) {
    return std::optional<LengthPlan>();
  }
  // The checked plan's units at the profiled size, and what they measured.
  const int64_t outside = Scaled(race.outside(), ratio);
  const double profiled = static_cast<double>(predicted_peak_bytes) /
                          std::pow(ratio, race.length_exponent());
  const int64_t grown = measured_peak_bytes - outside;
  if (profiled > 0 && grown > profiled) {
    race.RaiseLengthExponent(std::max(
        race.length_exponent(),
        std::log(static_cast<double>(grown) / profiled) / std::log(ratio)));
  }
  OFFLOAD_ASSIGN_OR_RETURN(LengthPlan out,
                           PlanWithin(race, ratio, race.units_budget()));
  return std::optional<LengthPlan>(std::move(out));
}

}  // namespace offload
