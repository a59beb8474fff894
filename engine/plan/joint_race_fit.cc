// What the race fits to its measured trials: the copy bandwidths
// (JointRace::Calibrate) and the bytes re-run units hold beyond the profile
// (JointRace::FitExcess).

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race.h"
#include "engine/plan/nonnegative_fit.h"

namespace offload {
namespace {

// How many units of `plan` have each choice: recomputed, selective (its
// saved bytes offloaded or not), offloaded.
std::array<double, 3> Counts(const JointPlan& plan) {
  std::array<double, 3> n = {0, 0, 0};
  for (UnitChoice c : plan.choice) {
    if (c == UnitChoice::kRecompute) n[0] += 1;
    const bool copied =
        c == UnitChoice::kOffload || c == UnitChoice::kSelectiveOffload;
    if (c == UnitChoice::kSelective || c == UnitChoice::kSelectiveOffload) {
      n[1] += 1;
    }
    if (copied) n[2] += 1;
  }
  return n;
}

}  // namespace

void JointRace::FitExcess() {
  std::vector<std::array<double, 3>> rows;
  std::vector<double> excess;
  for (const RaceTrial& t : all_trials_) {
    const std::array<double, 3> n = Counts(t.plan.plan);
    // The profiled units' prediction of the trial's plan, or, where they
    // refuse its budget, its own less the excesses it was made with.
    JointProblem profiled =
        Problem(t.plan.budget, allow_offload_, allow_recompute_);
    profiled.units = profiled_;
    StatusOr<JointPlan> again = EvaluateJoint(profiled, t.plan.plan.choice);
    const double predicted =
        again.ok() ? static_cast<double>(again->peak_bytes + outside_)
                   : static_cast<double>(t.plan.plan.peak_bytes + outside_) -
                         n[0] * static_cast<double>(t.plan.recompute_excess) -
                         n[1] * static_cast<double>(t.plan.selective_excess);
    rows.push_back(n);
    excess.push_back(static_cast<double>(t.peak_bytes) - predicted);
  }
  const std::array<double, 3> fit = NonNegativeFit(rows, excess);
  const int64_t recompute = std::llround(fit[0]);
  const int64_t selective = std::llround(fit[1]);
  if (recompute == recompute_excess_ && selective == selective_excess_) return;
  recompute_excess_ = recompute;
  selective_excess_ = selective;
  units_ = profiled_;
  for (UnitCost& u : units_) {
    if (u.recomputable) {
      u.input_bytes = std::min(u.input_bytes + recompute, u.saved_bytes);
    }
    if (u.selective) {
      u.selective_bytes = std::min(u.selective_bytes + selective, u.saved_bytes);
    }
  }
  smallest_.reset();
  RaceJointPlanFirst();
}

void JointRace::Calibrate(double step_ns, const std::vector<bool>& recompute) {
  std::vector<UnitChoice> choice(recompute.size(), UnitChoice::kKeep);
  for (size_t i = 0; i < recompute.size(); ++i) {
    if (recompute[i]) choice[i] = UnitChoice::kRecompute;
  }
  Calibrate(step_ns, choice);
}

void JointRace::Calibrate(double step_ns,
                          const std::vector<UnitChoice>& choice) {
  calibrated_ = true;
  double outside_ns = std::numeric_limits<double>::infinity();
  for (const RaceTrial& t : all_trials_) {
    if (t.plan.plan.offloaded_bytes == 0) {
      outside_ns = std::min(outside_ns, t.step_ns - t.plan.plan.step_ns);
    }
  }
  if (outside_ns == std::numeric_limits<double>::infinity()) outside_ns = 0;
  const double target = step_ns - std::max(outside_ns, 0.0);
  const JointProblem base = Problem(units_budget_, true, true);
  auto predicted = [&](double scale) {
    JointProblem p = base;
    p.d2h_gbps *= scale;
    p.h2d_gbps *= scale;
    StatusOr<JointPlan> again = EvaluateJoint(p, choice);
    return again.ok() ? again->step_ns
                      : std::numeric_limits<double>::infinity();
  };
  if (predicted(1.0) >= target) return;
  double low = 1.0 / 16, high = 1.0;
  for (int round = 0; round < 20; ++round) {
    const double middle = (low + high) / 2;
    (predicted(middle) > target ? low : high) = middle;
  }
  d2h_gbps_ *= high;
  h2d_gbps_ *= high;
  RaceJointPlanFirst();
}

}  // namespace offload
