// Which plan for longer batches serves when (engine/plan/longer_batches.h),
// on the race's stacks of identical units (joint_problem_testing.h: 300
// bytes each, input 30, re-created 270, forward 100 ns, backward 200 ns),
// recompute only, no margin, as joint_length_test.cc.

#include "engine/plan/longer_batches.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "engine/plan/joint_length.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_testing.h"
#include "engine/plan/joint_race.h"
#include "engine/plan/joint_race_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::Contains;
using ::testing::Each;

constexpr int kChecks = 2;
// A length no plan is made for (PlanForLength refuses it).
constexpr double kInfinite = std::numeric_limits<double>::infinity();

TEST(LongerBatchesTest, InTheRaceALongerBatchRunsThePlanForTheLongestSeen) {
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForOneForward(1.0));
  EXPECT_FALSE(none.has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> one, longer.ForOneForward(1.5));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->ratio, 1.5);
  EXPECT_THAT(one->length.plan.choice, Contains(UnitChoice::kRecompute));
  // The same longest: the same plan, not made again.
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> again, longer.ForOneForward(1.5));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id, one->id);
  // A batch of 2.0 was seen: a shorter one runs the plan for 2.0, which
  // fits it too.
  longer.RaceSaw(2.0);
  EXPECT_EQ(longer.seen(), 2.0);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> shorter, longer.ForOneForward(1.2));
  ASSERT_TRUE(shorter.has_value());
  EXPECT_EQ(shorter->ratio, 2.0);
  EXPECT_NE(shorter->id, one->id);
  ASSERT_OK_AND_ASSIGN(LengthPlan at_two, PlanForLength(race, 2.0));
  EXPECT_EQ(shorter->length.plan.choice, at_two.plan.choice);
  // Nothing is checked in the race.
  EXPECT_FALSE(longer.CheckBegins(one->id));
  EXPECT_FALSE(longer.CheckBegins(shorter->id));
}

TEST(LongerBatchesTest, InTheRaceAPlanThatCannotBeMadeIsSaidOnce) {
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  longer.RaceSaw(kInfinite);
  EXPECT_FALSE(longer.ForOneForward(1.5).ok());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForOneForward(1.5));
  EXPECT_FALSE(none.has_value());
}

TEST(LongerBatchesTest, ARaceStepOfTheRacesOwnPlanOnALongerBatchOverTheBudgetFitsTheGrowth) {
  // The race keeps every unit; at 1.2 that peaks at 1440 in the units and
  // 1800 with the 360 beside them: the budget. Measured so, the growth
  // stays; measured at 2000, the bytes grew faster than the batch, and the
  // plans made from then on grow so: the warm-up's end's for 1.2 re-runs.
  JointRace race = Started(1800, 300);
  ASSERT_THAT(race.plan().choice, Each(UnitChoice::kKeep));
  LongerBatches longer(race, kChecks);
  longer.RaceSaw(1.2);
  ASSERT_OK_AND_ASSIGN(bool raised, longer.RaceStepMeasured(1.2, 0, 1800));
  EXPECT_FALSE(raised);
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(raised, longer.RaceStepMeasured(0.9, 0, 5000));  // shorter
  EXPECT_FALSE(raised);
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(raised, longer.RaceStepMeasured(1.2, 0, 2000));
  EXPECT_TRUE(raised);
  const double grown = (2000.0 - 360) / 1440 * 1.2;  // the units at 1.2, over theirs at 1.0
  EXPECT_NEAR(race.length_exponent(), std::log(grown) / std::log(1.2), 1e-9);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.WarmUpEnded());
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->length.problem.units[0].saved_bytes,
            std::llround(300 * std::pow(1.2, race.length_exponent())));
  EXPECT_THAT(plan->length.plan.choice, Contains(UnitChoice::kRecompute));
  EXPECT_LE(plan->length.plan.peak_bytes, 1440);
}

TEST(LongerBatchesTest, ARaceStepOfThePlanForItsLongestOverTheBudgetMakesThatPlanAnew) {
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> one, longer.ForOneForward(1.5));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(longer.RaceStepMeasured(1.5, one->id + 1, 5000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(bool raised, longer.RaceStepMeasured(1.5, one->id, 1800));
  EXPECT_FALSE(raised);  // within the budget
  // A batch of 1.2 ran the plan made for 1.5: its step is not that
  // length's, and shows nothing.
  ASSERT_OK_AND_ASSIGN(raised, longer.RaceStepMeasured(1.2, one->id, 5000));
  EXPECT_FALSE(raised);
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(raised, longer.RaceStepMeasured(1.5, one->id, 2200));
  EXPECT_TRUE(raised);
  EXPECT_GT(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> anew, longer.ForOneForward(1.5));
  ASSERT_TRUE(anew.has_value());
  EXPECT_NE(anew->id, one->id);
  EXPECT_EQ(anew->length.problem.units[0].saved_bytes,
            std::llround(300 * std::pow(1.5, race.length_exponent())));
  EXPECT_LT(anew->length.plan.peak_bytes + 450, 2200);
}

TEST(LongerBatchesTest, AfterTheWarmUpOnlyTheLongestYetGetsAPlanAndItIsChecked) {
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.WarmUpEnded());
  EXPECT_FALSE(none.has_value());  // the race saw no longer batch
  EXPECT_FALSE(longer.ForEveryBatch().has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.Longest(1.5));
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(longer.CheckBegins(plan->id));
  ASSERT_OK_AND_ASSIGN(none, longer.Longest(1.5));
  EXPECT_FALSE(none.has_value());
  ASSERT_OK_AND_ASSIGN(none, longer.Longest(1.2));
  EXPECT_FALSE(none.has_value());
  // Steps of another plan (a shorter batch's) leave its checks be.
  EXPECT_FALSE(longer.CheckBegins(0));
  EXPECT_TRUE(longer.CheckBegins(plan->id));
  ASSERT_TRUE(longer.ForEveryBatch().has_value());
  EXPECT_EQ(longer.ForEveryBatch()->id, plan->id);
}

TEST(LongerBatchesTest, AfterTheWarmUpABatchRunsThePlanOfTheShortestRungAtOrAboveIt) {
  // Rungs at 1.2 (every unit kept: 1440 of the units' 1500) and 1.5 (two
  // units recomputed). The race's own plan serves 1.0 and below; 1.1 and
  // 1.2 the plan for 1.2; 1.3 and 1.5 the one for 1.5; 2.0 (three
  // recomputed), the longest yet, a rung of its own, then every batch
  // where its size is not known in time.
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_12, longer.ForBatch(1.2));
  ASSERT_TRUE(at_12.has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_15, longer.ForBatch(1.5));
  ASSERT_TRUE(at_15.has_value());
  EXPECT_THAT(at_12->length.plan.choice, Each(UnitChoice::kKeep));
  EXPECT_THAT(at_15->length.plan.choice, Contains(UnitChoice::kRecompute));
  for (const double profiled_or_shorter : {0.5, 1.0}) {
    ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForBatch(profiled_or_shorter));
    EXPECT_FALSE(none.has_value());
  }
  for (const auto& [ratio, id] : std::vector<std::pair<double, int>>{
           {1.1, at_12->id}, {1.2, at_12->id}, {1.2 * (1 - 1e-12), at_12->id},
           {1.3, at_15->id}, {1.5, at_15->id}}) {
    ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.ForBatch(ratio));
    ASSERT_TRUE(plan.has_value()) << ratio;
    EXPECT_EQ(plan->id, id) << ratio;
  }
  EXPECT_EQ(longer.ForEveryBatch()->id, at_15->id);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_20, longer.ForBatch(2.0));
  ASSERT_TRUE(at_20.has_value());
  EXPECT_EQ(at_20->ratio, 2.0);
  EXPECT_EQ(longer.ForEveryBatch()->id, at_20->id);
  std::vector<int> rungs;
  for (const LongerPlan& rung : longer.Rungs()) rungs.push_back(rung.id);
  EXPECT_EQ(rungs, (std::vector<int>{at_12->id, at_15->id, at_20->id}));
  // Each rung is checked, whichever ran between its steps.
  for (const int id : rungs) EXPECT_TRUE(longer.CheckBegins(id)) << id;
  // A length no plan can be made for is said once; then its batches, and
  // those between it and the longest rung, run the longest rung's plan.
  EXPECT_FALSE(longer.ForBatch(kInfinite).ok());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> above, longer.ForBatch(kInfinite));
  ASSERT_TRUE(above.has_value());
  EXPECT_EQ(above->id, at_20->id);
  EXPECT_EQ(longer.Rungs().size(), 3u);
}

TEST(LongerBatchesTest, LengthsThatGrowStepByStepKeepAtMostMaxRungs) {
  // A sequence-length warm-up: every batch a little longer than the last.
  // A rung whose plan runs as the next longer one's goes; beyond three
  // rungs, the one nearest below the next goes. The longest stays; every
  // batch still runs a rung at or above it; a dropped rung's checks end.
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks, /*max_rungs=*/3);
  std::vector<LongerPlan> made;
  for (double ratio = 1.05; ratio < 2.6; ratio += 0.05) {
    ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.ForBatch(ratio));
    ASSERT_TRUE(plan.has_value()) << ratio;
    EXPECT_EQ(plan->ratio, ratio);
    made.push_back(*plan);
    const std::vector<LongerPlan> rungs = longer.Rungs();
    ASSERT_LE(rungs.size(), 3u) << ratio;
    EXPECT_EQ(rungs.back().id, plan->id);
    for (size_t i = 0; i + 1 < rungs.size(); ++i) {
      EXPECT_FALSE(SameSchedule(rungs[i].length.plan, rungs[i + 1].length.plan)) << ratio;
    }
  }
  const std::vector<LongerPlan> rungs = longer.Rungs();
  EXPECT_GE(rungs.size(), 2u);  // (choices do differ along the way)
  for (const LongerPlan& plan : made) {
    const bool a_rung = std::any_of(rungs.begin(), rungs.end(),
                                    [&](const LongerPlan& r) { return r.id == plan.id; });
    EXPECT_EQ(longer.CheckBegins(plan.id), a_rung) << plan.ratio;
    ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> serves, longer.ForBatch(plan.ratio));
    ASSERT_TRUE(serves.has_value());
    EXPECT_GE(serves->ratio, plan.ratio);
  }
}

TEST(LongerBatchesTest, ARungThatRunsAsTheNextLongerOneGoes) {
  // 1.1 and 1.2 keep every unit (1320 and 1440 of the units' 1500): the
  // rung for 1.1 goes when 1.2's comes, and its batches run 1.2's plan.
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_11, longer.ForBatch(1.1));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_12, longer.ForBatch(1.2));
  ASSERT_TRUE(at_11.has_value() && at_12.has_value());
  ASSERT_TRUE(SameSchedule(at_11->length.plan, at_12->length.plan));
  ASSERT_EQ(longer.Rungs().size(), 1u);
  EXPECT_EQ(longer.Rungs()[0].id, at_12->id);
  EXPECT_FALSE(longer.CheckBegins(at_11->id));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> serves, longer.ForBatch(1.1));
  EXPECT_EQ(serves->id, at_12->id);
}

TEST(LongerBatchesTest, AShorterBatchRunsALighterPlanOfItsOwn) {
  // A budget of 700: the race's plan re-runs two units. A batch of 0.75
  // gets a lighter plan (no unit re-run that the race's keeps, fewer
  // re-run), a rung checked in turn; 0.8, within an eighth of it, runs the
  // race's. 0.5 gets its own, lighter still. The profiled length runs the
  // race's; no shorter rung serves every batch.
  JointRace race = Started(700, 0);
  const std::vector<UnitChoice> own = race.plan().choice;
  ASSERT_THAT(own, Contains(UnitChoice::kRecompute));
  auto rerun = [](const std::vector<UnitChoice>& choice) {
    return std::count(choice.begin(), choice.end(), UnitChoice::kRecompute);
  };
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_75, longer.ForBatch(0.75));
  ASSERT_TRUE(at_75.has_value());
  EXPECT_EQ(at_75->ratio, 0.75);
  EXPECT_LT(rerun(at_75->length.plan.choice), rerun(own));
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i] != UnitChoice::kRecompute) {
      EXPECT_NE(at_75->length.plan.choice[i], UnitChoice::kRecompute) << i;
    }
  }
  EXPECT_LE(at_75->length.plan.peak_bytes, race.units_budget());
  EXPECT_TRUE(longer.CheckBegins(at_75->id));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> near, longer.ForBatch(0.8));
  EXPECT_FALSE(near.has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> again, longer.ForBatch(0.75));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id, at_75->id);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_50, longer.ForBatch(0.5));
  ASSERT_TRUE(at_50.has_value());
  EXPECT_LT(rerun(at_50->length.plan.choice), rerun(at_75->length.plan.choice));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> profiled, longer.ForBatch(1.0));
  EXPECT_FALSE(profiled.has_value());
  EXPECT_FALSE(longer.ForEveryBatch().has_value());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForBatch(1.5));
  ASSERT_TRUE(none.has_value());  // a longer batch: the longest yet, its own
  EXPECT_EQ(longer.ForEveryBatch()->id, none->id);
}

TEST(LongerBatchesTest, AShorterBatchAnEighthFromEveryLengthPlannedForGetsAPlanOfItsOwn) {
  // 0.5 first, then 0.75: longer than a shorter length planned for, it
  // gets its own plan all the same (before, only the shortest yet did).
  // 0.7 and 0.55, each within an eighth of one planned for, run the plan
  // of the shortest rung at or above them: 0.75's.
  JointRace race = Started(700, 0);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_50, longer.ForBatch(0.5));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_75, longer.ForBatch(0.75));
  ASSERT_TRUE(at_50.has_value() && at_75.has_value());
  EXPECT_EQ(at_75->ratio, 0.75);
  EXPECT_NE(at_75->id, at_50->id);
  EXPECT_TRUE(longer.CheckBegins(at_75->id));
  ASSERT_EQ(longer.Rungs().size(), 2u);
  for (const double ratio : {0.7, 0.55}) {
    ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.ForBatch(ratio));
    ASSERT_TRUE(plan.has_value()) << ratio;
    EXPECT_EQ(plan->id, at_75->id) << ratio;
  }
  EXPECT_EQ(longer.Rungs().size(), 2u);
}

TEST(LongerBatchesTest, AShorterBatchsPlanOverTheBudgetOrOutOfMemoryGoes) {
  JointRace race = Started(700, 0);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_75, longer.ForBatch(0.75));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_50, longer.ForBatch(0.5));
  ASSERT_TRUE(at_75.has_value() && at_50.has_value());
  // Within the budget: held; then over it: its rung goes, and 0.75's
  // batches run the race's plan, not made again.
  ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep held, longer.StepChecked(at_75->id, 700));
  EXPECT_FALSE(held.dropped);
  EXPECT_FALSE(held.plan.has_value());
  ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep over, longer.StepChecked(at_75->id, 701));
  EXPECT_TRUE(over.dropped);
  EXPECT_FALSE(over.plan.has_value());
  EXPECT_FALSE(longer.CheckBegins(at_75->id));
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForBatch(0.75));
  EXPECT_FALSE(none.has_value());
  // 0.5's plan runs out of memory: its rung goes too.
  ASSERT_OK_AND_ASSIGN(LongerBatches::GivingWay way, longer.OutOfMemory(at_50->id, 0));
  EXPECT_TRUE(way.dropped);
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  ASSERT_OK_AND_ASSIGN(none, longer.ForBatch(0.5));
  EXPECT_FALSE(none.has_value());
  EXPECT_TRUE(longer.Rungs().empty());
}

TEST(LongerBatchesTest, AShorterBatchWhoseLighterPlanIsTheRacesOwnGetsNoRung) {
  // A budget every unit kept fits: the race's plan is the lightest.
  JointRace race = Started(1500, 0);
  ASSERT_THAT(race.plan().choice, Each(UnitChoice::kKeep));
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForBatch(0.5));
  EXPECT_FALSE(none.has_value());
  EXPECT_TRUE(longer.Rungs().empty());
}

TEST(LongerBatchesTest, WithoutRungsTheRacesPlanServesEveryBatch) {
  // A longer batch whose plan cannot be made leaves no rung: the race's
  // own plan, in force, serves on.
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  EXPECT_FALSE(longer.ForBatch(kInfinite).ok());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.ForBatch(1.5));
  EXPECT_FALSE(none.has_value());
  EXPECT_FALSE(longer.ForEveryBatch().has_value());
  EXPECT_TRUE(longer.Rungs().empty());
}

TEST(LongerBatchesTest, TheWarmUpsEndPlansForTheLongestBatchTheRaceSaw) {
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  longer.RaceSaw(1.5);
  longer.RaceSaw(1.2);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.WarmUpEnded());
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->ratio, 1.5);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.Longest(1.4));
  EXPECT_FALSE(none.has_value());
}

TEST(LongerBatchesTest, APlanThatCannotBeMadeLeavesTheLengthPlannedFor) {
  JointRace race = Started(1500, 0);
  LongerBatches longer(race, kChecks);
  EXPECT_FALSE(longer.Longest(kInfinite).ok());
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> none, longer.Longest(2.0));
  EXPECT_FALSE(none.has_value());
  EXPECT_TRUE(longer.Rungs().empty());
}

TEST(LongerBatchesTest, ACheckedPlanThatHoldsIsCheckedItsNumberOfSteps) {
  // At 1.2 every unit kept peaks at 1440 of the units' budget (360 beside).
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.Longest(1.2));
  ASSERT_TRUE(plan.has_value());
  ASSERT_THAT(plan->length.plan.choice, Each(UnitChoice::kKeep));
  for (int step = 0; step < kChecks; ++step) {
    ASSERT_TRUE(longer.CheckBegins(plan->id));
    ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep held, longer.StepChecked(plan->id, 1800));
    EXPECT_FALSE(held.plan.has_value());
  }
  EXPECT_FALSE(longer.CheckBegins(plan->id));
  EXPECT_EQ(longer.StepChecked(plan->id, 1800).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(race.length_exponent(), 1.0);
}

TEST(LongerBatchesTest, ACheckedStepOverTheBudgetMakesThePlanAnewCheckedInTurn) {
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.Longest(1.2));
  ASSERT_TRUE(plan.has_value());
  ASSERT_TRUE(longer.CheckBegins(plan->id));
  // A step of another plan is not this check's: nothing changes.
  EXPECT_EQ(longer.StepChecked(plan->id + 7, 5000).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(longer.CheckBegins(plan->id));
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep over, longer.StepChecked(plan->id, 1810));
  ASSERT_TRUE(over.plan.has_value());
  EXPECT_FALSE(over.same);
  EXPECT_GT(race.length_exponent(), 1.0);
  EXPECT_EQ(over.plan->ratio, 1.2);
  EXPECT_THAT(over.plan->length.plan.choice, Contains(UnitChoice::kRecompute));
  EXPECT_TRUE(longer.CheckBegins(over.plan->id));
  ASSERT_NE(longer.Find(over.plan->id), nullptr);
  EXPECT_EQ(longer.Find(over.plan->id)->length.plan.choice, over.plan->length.plan.choice);
  // The new plan takes the rung; the checked one's checks end.
  EXPECT_FALSE(longer.CheckBegins(plan->id));
  EXPECT_EQ(longer.ForEveryBatch()->id, over.plan->id);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> at_12, longer.ForBatch(1.1));
  EXPECT_EQ(at_12->id, over.plan->id);
}

TEST(LongerBatchesTest, TheSmallestPlanMeasuredOverComesBackWithItsFiguresAndTheChecksEnd) {
  // At 4.0 no plan fits the budget: the plan is the smallest.
  JointRace race = Started(1500, 100);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> smallest, longer.Longest(4.0));
  ASSERT_TRUE(smallest.has_value());
  ASSERT_GT(smallest->length.needs_budget, 1500);
  ASSERT_TRUE(longer.CheckBegins(smallest->id));
  const int64_t measured = smallest->length.needs_budget + 1000;
  ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep over,
                       longer.StepChecked(smallest->id, measured));
  ASSERT_TRUE(over.plan.has_value());
  EXPECT_TRUE(over.same);
  EXPECT_EQ(over.plan->length.plan.choice, smallest->length.plan.choice);
  EXPECT_NEAR(over.plan->length.needs_budget, measured, 4);
  EXPECT_FALSE(longer.CheckBegins(smallest->id));
  EXPECT_FALSE(longer.CheckBegins(over.plan->id));
  EXPECT_EQ(longer.ForEveryBatch()->id, over.plan->id);
}

TEST(LongerBatchesTest, PlansRunAlikeWithTheSameChoicesAndSchedule) {
  JointPlan a;
  a.choice = {UnitChoice::kOffload, UnitChoice::kKeep};
  a.released_during = {1, -1};
  a.reloaded_during = {1, -1};
  JointPlan b = a;
  b.peak_bytes = 7;  // figures do not count
  EXPECT_TRUE(SameSchedule(a, b));
  b.reloaded_during = {0, -1};
  EXPECT_FALSE(SameSchedule(a, b));
  b = a;
  b.choice[1] = UnitChoice::kRecompute;
  EXPECT_FALSE(SameSchedule(a, b));
}

}  // namespace
}  // namespace offload
