// The race at the device's edge: a plan that ran out of device memory
// (JointRace::OutOfMemory), and the lowering of the units' budget that an
// out-of-memory run and a faster trial over the budget share.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race.h"

namespace offload {

bool JointRace::RanOutOfMemory(const std::vector<UnitChoice>& choice) const {
  return std::find(out_of_memory_.begin(), out_of_memory_.end(), choice) !=
         out_of_memory_.end();
}

RaceStep JointRace::LowerAndReplan(int64_t lowered) {
  std::vector<RaceTrial> fitting;
  for (const RaceTrial& t : trials_) {
    if (t.peak_bytes <= Allowed()) fitting.push_back(t);
  }
  units_budget_ = lowered;
  RaceStep out = Replan();
  trials_.insert(trials_.end(), fitting.begin(), fitting.end());
  // A candidate already measured to fit runs no more.
  candidates_.erase(
      std::remove_if(candidates_.begin(), candidates_.end(),
                     [&](const RacePlan& c) {
                       return std::any_of(
                           fitting.begin(), fitting.end(),
                           [&](const RaceTrial& t) {
                             return t.plan.plan.choice == c.plan.choice;
                           });
                     }),
      candidates_.end());
  return out;
}

std::string JointRace::RunSmallestAnyway() {
  const int64_t smallest = SmallestUnits();
  std::optional<JointPlan> plan = PlanFor(smallest, allow_offload_, allow_recompute_);
  if (!plan.has_value()) return "";
  candidates_.clear();
  Apply(Made(*std::move(plan), smallest));
  settled_ = true;
  return "actoffload: every plan the race can make of the units ran out of device "
         "memory; the smallest runs (the device holds less than any plan needs)";
}

RaceStep JointRace::OutOfMemory(int64_t peak_bytes) {
  const std::vector<UnitChoice> choice = plan_.plan.choice;
  const int64_t failed_peak = plan_.plan.peak_bytes;
  out_of_memory_.push_back(choice);
  runs_.clear();
  auto same = [&](const auto& x) { return x.plan.plan.choice == choice; };
  for (std::vector<RaceTrial>* trials : {&trials_, &all_trials_}) {
    trials->erase(std::remove_if(trials->begin(), trials->end(), same),
                  trials->end());
  }
  candidates_.erase(
      std::remove_if(candidates_.begin(), candidates_.end(),
                     [&](const RacePlan& c) { return c.plan.choice == choice; }),
      candidates_.end());
  rematch_.erase(
      std::remove_if(rematch_.begin(), rematch_.end(),
                     [&](const RacePlan& c) { return c.plan.choice == choice; }),
      rematch_.end());
  rematching_ = false;
  settled_ = false;
  checks_left_ = 0;
  std::string warning;
  const int64_t distance =
      peak_bytes > budget_ ? peak_bytes - budget_ : budget_ - peak_bytes;
  if (peak_bytes < budget_) {
    warning = "actoffload: the device ran out of memory at " +
              std::to_string(peak_bytes) +
              " bytes above the forward's start, within the budget of " +
              std::to_string(budget_) +
              " bytes: it cannot hold that budget; the budget is now " +
              std::to_string(peak_bytes) + " bytes";
    budget_ = peak_bytes;
  }
  // Below what the model predicts for the plan that failed, too: a plan
  // predicted to hold more would fail as well. (Where the step failed at
  // the budget, the distance is none: a plan made after the warm-up, never
  // measured, failed at what the budget allowed, and the fastest plan of
  // the budget as it was, predicted to hold more, ran out of memory next.)
  const int64_t lowered =
      std::min(units_budget_ - distance -
                   static_cast<int64_t>(budget_ * options_.margin),
               failed_peak - 1);
  RaceStep out;
  if (lowered >= SmallestUnits()) {
    out = LowerAndReplan(lowered);
  } else if (std::optional<RacePlan> last = LastResort()) {
    candidates_.clear();
    Apply(*last);
    out.applied = true;
  } else if (!all_trials_.empty()) {
    out.warning = KeepLowest();
    out.applied = true;
  } else {
    units_budget_ = SmallestUnits();
    out = Replan();
    if (!out.applied) {
      out.warning = RunSmallestAnyway();
      out.applied = !out.warning.empty();
    }
  }
  if (!warning.empty()) {
    out.warning = out.warning.empty() ? warning : warning + "; " + out.warning;
  }
  return out;
}

}  // namespace offload
