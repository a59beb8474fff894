// The plan for a longer batch (engine/plan/joint_length.h) on the race's
// stacks of identical units (joint_problem_testing.h: 300 bytes each,
// input 30, re-created 270, forward 100 ns, backward 200 ns), recompute
// only unless said, no margin.

#include "engine/plan/joint_length.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

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


TEST(JointLengthTest, AUnitsBytesAndTimesScaleWithTheBatch) {
  UnitCost u = SelectiveStack(1, 1.0, 1).units[0];
  u.forward_transient_bytes = 10;
  u.selective_backward_transient_bytes = 1;
  const UnitCost s = ScaledUnit(u, 1.5);
  EXPECT_EQ(s.saved_bytes, 450);
  EXPECT_EQ(s.input_bytes, 45);
  EXPECT_EQ(s.recompute_bytes, 405);
  EXPECT_EQ(s.selective_bytes, 90);
  EXPECT_EQ(s.forward_transient_bytes, 15);
  EXPECT_EQ(s.selective_backward_transient_bytes, 2);  // 1.5 rounds up
  EXPECT_EQ(s.backward_transient_bytes, 0);            // none stays none
  EXPECT_DOUBLE_EQ(s.forward_ns, 150);
  EXPECT_DOUBLE_EQ(s.backward_ns, 300);
  EXPECT_DOUBLE_EQ(s.recompute_ns, 150);
  EXPECT_DOUBLE_EQ(s.selective_ns, 15);
  EXPECT_TRUE(s.recomputable && s.selective);
}

TEST(JointLengthTest, APlanThatStillFitsIsKept) {
  // Keep-all peaks at 1200 of 1500; half as long again it is 1800: over.
  // 10% longer (1320) it still fits, and stays.
  JointRace race = Started(1500, 0);
  ASSERT_THAT(race.plan().choice, Each(UnitChoice::kKeep));
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 1.1));
  EXPECT_EQ(longer.plan.choice, race.plan().choice);
  EXPECT_EQ(longer.needs_budget, 0);
  EXPECT_EQ(longer.problem.units[0].saved_bytes, 330);
}

TEST(JointLengthTest, ALongerBatchIsPlannedWithinTheSameBudget) {
  JointRace race = Started(1500, 0);
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 1.5));
  EXPECT_EQ(longer.needs_budget, 0);
  EXPECT_THAT(longer.plan.choice, Contains(UnitChoice::kRecompute));
  EXPECT_LE(longer.plan.peak_bytes, 1500);
  EXPECT_EQ(longer.problem.budget, 1500);
  // The plan is what the scaled units predict for its choice.
  ASSERT_OK_AND_ASSIGN(JointPlan again,
                       EvaluateJoint(longer.problem, longer.plan.choice));
  EXPECT_EQ(again.peak_bytes, longer.plan.peak_bytes);
  // Unscaled, that choice would have been planned for 1500 at 1.0 too,
  // and the kept-all plan at 1.5 is over: the scale is what changed it.
  JointProblem at_length = longer.problem;
  EXPECT_FALSE(EvaluateJoint(at_length, race.plan().choice).ok());
}

TEST(JointLengthTest, TheBytesBesideTheUnitsGrowWithThemOutOfTheUnitsBudget) {
  // 300 beside the units: at 1.5 they are 450, so the units have 150 less.
  JointRace race = Started(1800, 300);
  ASSERT_EQ(race.units_budget(), 1500);
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 1.5));
  EXPECT_EQ(longer.problem.budget, 1350);
  EXPECT_LE(longer.plan.peak_bytes, 1350);
  EXPECT_EQ(longer.needs_budget, 0);
}

TEST(JointLengthTest, WhereNoPlanFitsTheLeastBudgetAtThatLengthIsNamed) {
  JointRace race = Started(1500, 100);
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 4.0));
  JointProblem scaled = Stack(4, 1.0, 1);
  scaled.allow_offload = false;  // as the race
  for (UnitCost& u : scaled.units) u = ScaledUnit(u, 4.0);
  ASSERT_OK_AND_ASSIGN(int64_t least, SmallestJointBudget(scaled));
  EXPECT_GT(least + 400, 1500);
  EXPECT_EQ(longer.needs_budget, least + 400);
  EXPECT_EQ(longer.problem.budget, least);
  EXPECT_LE(longer.plan.peak_bytes, least);
}

TEST(JointLengthTest, OffloadingPlansAreScaledToo) {
  // Offload allowed: the plan for the longer batch (600 bytes a unit) fits
  // its budget as the scaled units predict, with the same copy bandwidths.
  JointRace race = Started(900, 0, /*allow_offload=*/true);
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 2.0));
  EXPECT_EQ(longer.problem.d2h_gbps, 1.0);
  EXPECT_TRUE(longer.problem.allow_offload);
  EXPECT_EQ(longer.needs_budget, 0);
  EXPECT_LE(longer.plan.peak_bytes, 900);
  EXPECT_GT(longer.plan.offloaded_bytes, 0);  // twice 300 a unit: 600 each
  EXPECT_OK(ValidateJointPlan(longer.plan, longer.problem));
}

TEST(JointLengthTest, AShorterBatchsPlanIsTheRacesLightenedWithinTheUnitsBudget) {
  // 800, 100 of it beside the units: the race re-runs two of four units
  // (300 bytes each). At
  // 0.75 one of them is kept (the units at 225 each); at 0.5 both; the
  // bytes beside the units are not taken to shrink. Ratios outside (0, 1)
  // are refused; where the race's plan is the lightest, none.
  JointRace race = Started(800, 100);
  ASSERT_EQ(race.units_budget(), 700);
  ASSERT_EQ(std::count(race.plan().choice.begin(), race.plan().choice.end(),
                       UnitChoice::kRecompute), 2);
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> at_75, PlanForShorter(race, 0.75));
  ASSERT_TRUE(at_75.has_value());
  EXPECT_EQ(at_75->problem.budget, race.units_budget());
  EXPECT_EQ(at_75->problem.units[0].saved_bytes, 225);
  EXPECT_EQ(std::count(at_75->plan.choice.begin(), at_75->plan.choice.end(),
                       UnitChoice::kRecompute), 1);
  EXPECT_LE(at_75->plan.peak_bytes, race.units_budget());
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> at_50, PlanForShorter(race, 0.5));
  ASSERT_TRUE(at_50.has_value());
  EXPECT_THAT(at_50->plan.choice, Each(UnitChoice::kKeep));
  for (const double ratio : {0.0, 1.0, 1.5, std::nan("")}) {
    EXPECT_EQ(PlanForShorter(race, ratio).status().code(), StatusCode::kInvalidArgument)
        << ratio;
  }
  JointRace roomy = Started(2000, 100);
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> none, PlanForShorter(roomy, 0.5));
  EXPECT_FALSE(none.has_value());
}

TEST(JointLengthTest, APlanForALongerBatchThatRanOutOfMemoryGivesWayToOnePredictedLower) {
  // 300 beside the units (450 at 1.5): the plan for 1.5 fits 1350 of the
  // units' 1500. The device held less than it: the next plan for 1.5 is
  // predicted an eighth of its peak below it (length_step), and the race
  // plans longer batches within that.
  JointRace race = Started(1800, 300);
  const JointPlan kept = race.plan();
  ASSERT_OK_AND_ASSIGN(LengthPlan failed, PlanForLength(race, 1.5));
  ASSERT_OK_AND_ASSIGN(LengthPlan below,
                       PlanForLengthBelow(race, 1.5, failed.plan.peak_bytes));
  EXPECT_LT(below.plan.peak_bytes, failed.plan.peak_bytes);
  EXPECT_NE(below.plan.choice, failed.plan.choice);
  EXPECT_EQ(below.needs_budget, 0);
  const int64_t step = static_cast<int64_t>(failed.plan.peak_bytes * 0.125);
  EXPECT_EQ(below.problem.budget, failed.plan.peak_bytes - step);
  EXPECT_LE(below.plan.peak_bytes, failed.plan.peak_bytes - step);
  EXPECT_EQ(race.units_budget(), failed.plan.peak_bytes - step + 150);
  EXPECT_OK(ValidateJointPlan(below.plan, below.problem));
  // Planned again for that length, the race gives the lower plan.
  ASSERT_OK_AND_ASSIGN(LengthPlan again, PlanForLength(race, 1.5));
  EXPECT_EQ(again.plan.choice, below.plan.choice);
  // The race's own plan and budget stay: nothing measured them over.
  EXPECT_EQ(race.plan().choice, kept.choice);
  EXPECT_EQ(race.budget(), 1800);
  // A budget named for longer batches counts what the units' budget came
  // down by (the model's error the device showed).
  ASSERT_OK_AND_ASSIGN(LengthPlan four, PlanForLength(race, 4.0));
  JointProblem scaled = Stack(4, 1.0, 1);
  scaled.allow_offload = false;  // as the race
  for (UnitCost& u : scaled.units) u = ScaledUnit(u, 4.0);
  ASSERT_OK_AND_ASSIGN(int64_t least, SmallestJointBudget(scaled));
  EXPECT_EQ(four.needs_budget, least + 1200 + (1500 - race.units_budget()));
}

TEST(JointLengthTest, WhereTheFailedPlanForALongerBatchWasTheSmallestNoneIsBelowIt) {
  // At 4.0 no plan fits: the one made is the smallest, and nothing is
  // predicted below it. The race is unchanged.
  JointRace race = Started(1500, 100);
  ASSERT_OK_AND_ASSIGN(LengthPlan smallest, PlanForLength(race, 4.0));
  ASSERT_GT(smallest.needs_budget, 0);
  const int64_t units_budget = race.units_budget();
  EXPECT_EQ(PlanForLengthBelow(race, 4.0, smallest.plan.peak_bytes).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(race.units_budget(), units_budget);
  EXPECT_EQ(PlanForLengthBelow(race, 0.5, 1000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(race.units_budget(), units_budget);
}

TEST(JointLengthTest, APlanForALongerBatchMeasuredWithinTheBudgetHolds) {
  // At 1.2 every unit kept peaks at 1440, the units' budget there (360
  // beside them). Measured at the budget (the tolerance is none here): no
  // plan, the race unchanged. Ten bytes over (2.5 a unit): one unit re-run.
  JointRace race = Started(1800, 300);
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 1.2));
  ASSERT_THAT(longer.plan.choice, Each(UnitChoice::kKeep));
  ASSERT_EQ(longer.plan.peak_bytes, 1440);
  const int64_t units_budget = race.units_budget();
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> none,
                       PlanForLengthMeasured(race, 1.2, longer.plan.peak_bytes, 0, 1800));
  EXPECT_FALSE(none.has_value());
  EXPECT_EQ(race.units_budget(), units_budget);
  EXPECT_EQ(race.length_exponent(), 1.0);
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> lower,
                       PlanForLengthMeasured(race, 1.2, longer.plan.peak_bytes, 0, 1810));
  ASSERT_TRUE(lower.has_value());
  EXPECT_GT(race.length_exponent(), 1.0);
  EXPECT_LE(lower->plan.peak_bytes, 1440);
  EXPECT_THAT(lower->plan.choice, Contains(UnitChoice::kRecompute));
}

TEST(JointLengthTest, APlanForALongerBatchMeasuredOverTheBudgetFitsHowTheBytesGrow) {
  // 300 beside the units (450 at 1.5): the plan for 1.5 is made within
  // 1350 of the units' 1500. A step of it measured 2000: its units held
  // 1550, where the model said `predicted` (their bytes at the profiled
  // size times 1.5). The bytes grow as 1.5 to the power that gives 1550;
  // the plan for 1.5 made with that growth fits 1350, where the checked
  // one, predicted anew, is what it measured. Longer batches grow by that
  // power too.
  JointRace race = Started(1800, 300);
  const JointPlan kept = race.plan();
  const int64_t units_budget = race.units_budget();
  ASSERT_OK_AND_ASSIGN(LengthPlan longer, PlanForLength(race, 1.5));
  const int64_t predicted = longer.plan.peak_bytes;
  ASSERT_OK_AND_ASSIGN(std::optional<LengthPlan> lower,
                       PlanForLengthMeasured(race, 1.5, predicted, 0, 2000));
  ASSERT_TRUE(lower.has_value());
  const double grown = 1550.0 / (predicted / 1.5);
  EXPECT_NEAR(race.length_exponent(), std::log(grown) / std::log(1.5), 1e-9);
  EXPECT_EQ(lower->problem.units[0].saved_bytes, std::llround(300 * grown));
  EXPECT_DOUBLE_EQ(lower->problem.units[0].forward_ns, 150);  // times stay linear
  EXPECT_EQ(lower->problem.budget, 1350);
  EXPECT_LE(lower->plan.peak_bytes, 1350);
  EXPECT_NE(lower->plan.choice, longer.plan.choice);
  EXPECT_EQ(lower->needs_budget, 0);
  EXPECT_OK(ValidateJointPlan(lower->plan, lower->problem));
  JointProblem unbounded = lower->problem;
  unbounded.budget = 1 << 20;
  ASSERT_OK_AND_ASSIGN(JointPlan checked, EvaluateJoint(unbounded, longer.plan.choice));
  EXPECT_NEAR(checked.peak_bytes, 1550, 4);  // the checked one, as measured
  ASSERT_OK_AND_ASSIGN(LengthPlan again, PlanForLength(race, 1.5));
  EXPECT_EQ(again.plan.choice, lower->plan.choice);
  ASSERT_OK_AND_ASSIGN(LengthPlan twice, PlanForLength(race, 2.0));
  EXPECT_EQ(twice.problem.units[0].saved_bytes,
            std::llround(300 * std::pow(2.0, race.length_exponent())));
  // The race's own plan, budget and units' budget stay: nothing measured
  // them over.
  EXPECT_EQ(race.plan().choice, kept.choice);
  EXPECT_EQ(race.budget(), 1800);
  EXPECT_EQ(race.units_budget(), units_budget);
}

TEST(JointLengthTest, TheSmallestPlanForALongerBatchMeasuredOverComesBackNeedingMore) {
  // At 4.0 no plan fits: the one made is the smallest, and it holds up to
  // the budget it needs. Measured 1000 over that, it is the plan for 4.0
  // again, its needs_budget grown to what it measured.
  JointRace race = Started(1500, 100);
  ASSERT_OK_AND_ASSIGN(LengthPlan smallest, PlanForLength(race, 4.0));
  ASSERT_GT(smallest.needs_budget, 1500);
  ASSERT_OK_AND_ASSIGN(
      std::optional<LengthPlan> none,
      PlanForLengthMeasured(race, 4.0, smallest.plan.peak_bytes, smallest.needs_budget,
                            smallest.needs_budget));
  EXPECT_FALSE(none.has_value());
  const int64_t measured = smallest.needs_budget + 1000;
  ASSERT_OK_AND_ASSIGN(
      std::optional<LengthPlan> again,
      PlanForLengthMeasured(race, 4.0, smallest.plan.peak_bytes, smallest.needs_budget,
                            measured));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->plan.choice, smallest.plan.choice);
  EXPECT_NEAR(again->needs_budget, measured, 4);
  EXPECT_EQ(PlanForLengthMeasured(race, 1.0, 1000, 0, 1600).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(JointLengthTest, AChoicesPeakAtALengthIsItsScaledUnitsPeakWhateverTheBudget) {
  // Every unit kept peaks at 1440 at 1.2 (the test above); at 2.0, 2400,
  // over the units' budget, and said all the same.
  JointRace race = Started(1800, 300);
  EXPECT_THAT(PeakAtLength(race, 1.2, race.plan().choice), IsOkAndHolds(1440));
  EXPECT_THAT(PeakAtLength(race, 2.0, race.plan().choice), IsOkAndHolds(2400));
  EXPECT_EQ(PeakAtLength(race, 0.5, race.plan().choice).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(PeakAtLength(race, 1.2, {UnitChoice::kKeep}).ok());  // not its units
}

TEST(JointLengthTest, ARatioBelowOneIsRefused) {
  JointRace race = Started(1500, 0);
  EXPECT_EQ(PlanForLength(race, 0.5).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanForLength(race, std::nan("")).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload
