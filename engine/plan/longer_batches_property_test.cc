// LongerBatches (engine/plan/longer_batches.h) under any sequence of calls
// on a random race (RapidCheck).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "engine/plan/joint_length.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_testing.h"
#include "engine/plan/joint_race.h"
#include "engine/plan/joint_race_testing.h"
#include "engine/plan/longer_batches.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

constexpr int kChecks = 2;

// Any sequence of calls on a random race: a plan comes after the warm-up
// only for the longest batch yet or a shorter length an eighth from every
// shorter one planned for before, and a batch runs the shortest rung's at
// or above it; every plan made validates and, where it
// names no larger budget, fits the one it was made for; a plan that ran out
// of memory at its length is never given again there; the growth never
// falls; only rungs' plans are checked, and at most kMaxRungs are kept; a check of a plan not
// checked is refused and changes nothing.
RC_GTEST_PROP(LongerBatchesProperties, PlansServeAsTheContractSays, ()) {
  const int n = *rc::gen::inRange(2, 6);
  const auto units = *rc::gen::container<std::vector<UnitCost>>(n, GenUnitCost(1000));
  int64_t total = 0;
  for (const UnitCost& u : units) total += u.saved_bytes;
  const int64_t outside = *rc::gen::inRange<int64_t>(0, total / 4 + 1);
  const int64_t budget = *rc::gen::inRange<int64_t>(total / 2 + 1, 2 * total + 2) + outside;
  std::vector<int> index(n);
  for (int i = 0; i < n; ++i) index[i] = i;
  JointRaceOptions options;
  options.margin = 0;
  JointRace race(units, 1.0, 1.0, budget, outside, *rc::gen::arbitrary<bool>(),
                 /*allow_recompute=*/true, index, options);
  RC_ASSERT(race.Start().ok());
  LongerBatches longer(race, kChecks);
  std::vector<LongerPlan> made;
  std::vector<std::pair<double, JointPlan>> failed;
  double longest = 1.0;
  int given = 0;  // the plan OutOfMemory gave last
  auto check_made = [&](const LongerPlan& plan) {
    RC_ASSERT(ValidateJointPlan(plan.length.plan, plan.length.problem).ok());
    if (plan.length.needs_budget == 0) {
      RC_ASSERT(plan.length.plan.peak_bytes <= plan.length.problem.budget);
    }
    made.push_back(plan);
  };
  auto any_made = [&]() {
    return made.empty() ? 0 : made[*rc::gen::inRange<size_t>(0, made.size())].id;
  };
  const std::vector<double> ratios = {0.5, 0.55, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0};
  std::vector<double> shorter;  // the lengths shorter plans were made for
  for (int step = 0; step < 24; ++step) {
    const double exponent = race.length_exponent();
    const double ratio = *rc::gen::elementOf(ratios);
    switch (*rc::gen::inRange(0, 5)) {
      case 0: {
        StatusOr<std::optional<LongerPlan>> plan = longer.Longest(ratio);
        const bool longer_yet = ratio > longest;
        longest = std::max(longest, ratio);
        if (!plan.ok() || !plan->has_value()) {
          RC_ASSERT(!longer_yet || !plan.ok());
          break;
        }
        RC_ASSERT(longer_yet);
        RC_ASSERT(longer.CheckBegins((*plan)->id));
        RC_ASSERT(longer.ForEveryBatch()->id == (*plan)->id);
        check_made(**plan);
        break;
      }
      case 1: {  // a batch whose size is known in time: the shortest rung at or above it
        StatusOr<std::optional<LongerPlan>> plan = longer.ForBatch(ratio);
        longest = std::max(longest, ratio);
        if (!plan.ok() || !plan->has_value()) {
          RC_ASSERT(!plan.ok() || ratio < 1.0 || ratio == 1.0 ||
                    !longer.ForEveryBatch().has_value());
          break;
        }
        RC_ASSERT(ratio != 1.0);
        RC_ASSERT(((*plan)->ratio < 1) == (ratio < 1));
        const std::vector<LongerPlan> rungs = longer.Rungs();
        bool a_rung = false;
        for (const LongerPlan& rung : rungs) {
          a_rung = a_rung || rung.id == (*plan)->id;
          if (rung.ratio >= ratio) RC_ASSERT((*plan)->ratio <= rung.ratio);
        }
        RC_ASSERT(a_rung);
        RC_ASSERT((*plan)->ratio >= ratio || (*plan)->id == longer.ForEveryBatch()->id);
        if (ratio < 1) {  // lighter than the race's: it re-runs no unit the race's keeps
          for (size_t i = 0; i < race.plan().choice.size(); ++i) {
            if (race.plan().choice[i] == UnitChoice::kKeep) {
              RC_ASSERT((*plan)->length.plan.choice[i] != UnitChoice::kRecompute);
            }
          }
        }
        if (std::none_of(made.begin(), made.end(),
                         [&](const LongerPlan& p) { return p.id == (*plan)->id; })) {
          check_made(**plan);
          if (ratio < 1) {  // made for this length: an eighth from every one before
            RC_ASSERT((*plan)->ratio == ratio);
            for (const double before : shorter) {
              RC_ASSERT(std::max(before, ratio) >=
                        std::min(before, ratio) * LongerBatches::kShorterApart);
            }
            shorter.push_back(ratio);
          }
        }
        break;
      }
      case 2: {
        const int id = any_made();
        const int64_t peak = *rc::gen::inRange<int64_t>(0, 4 * budget);
        if (!longer.CheckBegins(id)) {
          const std::vector<LongerPlan> rungs = longer.Rungs();
          RC_ASSERT(longer.StepChecked(id, peak).status().code() ==
                    StatusCode::kFailedPrecondition);
          RC_ASSERT(longer.Rungs().size() == rungs.size());
          break;
        }
        StatusOr<LongerBatches::CheckedStep> next = longer.StepChecked(id, peak);
        if (next.ok() && next->plan.has_value()) {
          RC_ASSERT(!longer.CheckBegins(id));  // its rung is the new plan's
          check_made(*next->plan);
        }
        break;
      }
      case 3: {  // the plan given last, or any
        const int id = given != 0 && *rc::gen::arbitrary<bool>() ? given : any_made();
        if (id == 0) break;
        const LongerPlan lost = *longer.Find(id);
        failed.emplace_back(lost.ratio, lost.length.plan);
        StatusOr<LongerBatches::GivingWay> way = longer.OutOfMemory(id, any_made());
        RC_ASSERT(way.ok());
        given = way->plan.has_value() ? way->plan->id : 0;
        if (!way->plan.has_value()) break;
        for (const auto& [at, plan] : failed) {
          RC_ASSERT(!(at == way->plan->ratio && SameSchedule(plan, way->plan->length.plan)));
        }
        check_made(*way->plan);
        break;
      }
      case 4:
        (void)longer.RaceStepMeasured(ratio, *rc::gen::element(0, any_made()),
                                      *rc::gen::inRange<int64_t>(0, 4 * budget));
        break;
    }
    RC_ASSERT(race.length_exponent() >= exponent);
    // Rungs only for lengths planned for; only rungs' plans are checked.
    const std::vector<LongerPlan> rungs = longer.Rungs();
    RC_ASSERT(rungs.size() <= static_cast<size_t>(LongerBatches::kMaxRungs));
    for (size_t i = 0; i < rungs.size(); ++i) {
      RC_ASSERT(rungs[i].ratio != 1.0 && rungs[i].ratio <= longest);
      RC_ASSERT(i == 0 || rungs[i - 1].ratio < rungs[i].ratio);
    }
    for (const LongerPlan& plan : made) {
      if (!longer.CheckBegins(plan.id)) continue;
      RC_ASSERT(std::any_of(rungs.begin(), rungs.end(),
                            [&](const LongerPlan& rung) { return rung.id == plan.id; }));
    }
  }
}

}  // namespace
}  // namespace offload
