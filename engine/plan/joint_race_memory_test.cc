// The race at the device's edge (JointRace::OutOfMemory): a plan that ran
// out of device memory is never run again nor kept, and the budget comes
// down to what the device held. Stacks of identical units
// (joint_problem_testing.h: 300 bytes each, forward 100 ns, backward
// 200 ns), with steps and peaks scripted per candidate
// (joint_race_testing.h: no rematch, no fit of the excesses, every
// candidate run).

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race.h"
#include "engine/plan/joint_race_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Whether a plan of `choice` is in force, among the candidates or trials.
bool Anywhere(const JointRace& race, const std::vector<UnitChoice>& choice) {
  auto same = [&](const auto& x) { return x.plan.plan.choice == choice; };
  return race.plan().choice == choice ||
         std::any_of(race.candidates().begin(), race.candidates().end(),
                     [&](const RacePlan& c) { return c.plan.choice == choice; }) ||
         std::any_of(race.trials().begin(), race.trials().end(), same) ||
         std::any_of(race.all_trials().begin(), race.all_trials().end(), same);
}

// The joint plan (predicted at 900) fails in its second run at 1040 bytes,
// 40 over the budget of 1000: it is dropped, the units' budget comes down
// by the excess and the margin (990 - 40 - 10 = 940), and below the failed
// plan's prediction (899), and the plans raced after it never include it.
TEST(JointRaceMemoryTest, ACandidateOutOfMemoryOverTheBudgetIsDroppedAndTheUnitsLowered) {
  JointRace race = FourUnits(1.0, 1000, 0, 0.01);
  ASSERT_OK(race.Start());
  ASSERT_EQ(race.units_budget(), 990);
  const std::vector<UnitChoice> failed = race.plan().choice;
  ASSERT_EQ(race.plan().peak_bytes, 900);
  EXPECT_FALSE(race.Measured(1.0, 0).applied);
  const RaceStep step = race.OutOfMemory(1040);
  EXPECT_TRUE(step.applied);
  EXPECT_THAT(step.warning, IsEmpty());
  EXPECT_EQ(race.budget(), 1000);
  EXPECT_EQ(race.units_budget(), 899);
  EXPECT_LE(race.plan().peak_bytes, 899);
  ASSERT_EQ(race.out_of_memory().size(), 1u);
  EXPECT_EQ(race.out_of_memory()[0], failed);
  EXPECT_FALSE(Anywhere(race, failed));
  for (int k = 0; !race.settled() && k < 10; ++k) {
    RunCandidate(race, 1000 + k, 900);
    EXPECT_FALSE(Anywhere(race, failed));
  }
  EXPECT_TRUE(race.settled());
}

// A candidate fails at 800 bytes, within the budget of 1000: the device
// cannot hold the budget, which becomes 800 (warned); the units' budget
// comes down by 200 and the margin, and a trial measured at 950 before it
// fits no more.
TEST(JointRaceMemoryTest, OutOfMemoryWithinTheBudgetLowersTheBudgetToWhatTheDeviceHeld) {
  JointRace race = FourUnits(1.0, 1000, 0, 0.01);
  ASSERT_OK(race.Start());
  const std::vector<UnitChoice> first = race.plan().choice;
  RunCandidate(race, 1000, 950);
  ASSERT_FALSE(race.candidates().empty() && race.settled());
  const std::vector<UnitChoice> failed = race.plan().choice;
  ASSERT_NE(failed, first);
  race.Measured(1.0, 0);
  const RaceStep step = race.OutOfMemory(800);
  EXPECT_TRUE(step.applied);
  EXPECT_THAT(step.warning,
              HasSubstr("the device ran out of memory at 800 bytes above the "
                        "forward's start, within the budget of 1000 bytes"));
  EXPECT_THAT(step.warning, HasSubstr("the budget is now 800 bytes"));
  EXPECT_EQ(race.budget(), 800);
  EXPECT_EQ(race.units_budget(), 990 - 200 - 8);
  EXPECT_LE(race.plan().peak_bytes, 782);
  for (const RaceTrial& t : race.trials()) EXPECT_LE(t.peak_bytes, 800);
  EXPECT_FALSE(Anywhere(race, failed));
  for (int k = 0; !race.settled() && k < 10; ++k) RunCandidate(race, 2000 + k, 700);
  EXPECT_TRUE(race.settled());
  EXPECT_NE(race.plan().choice, failed);
  EXPECT_NE(race.plan().choice, first);  // measured at 950, over 800
}

// The kept plan (predicted at 660, measured at 800) fails in its checks,
// at 850 (under the budget of 900): the race starts again for 850,
// without it, and for units below its prediction (659: plans predicted
// above it would hold more than 850 as this one did).
TEST(JointRaceMemoryTest, AKeptPlanOutOfMemoryInItsChecksIsReplaced) {
  JointRace race = FourUnits(1.0, 900, 0, 0);
  ASSERT_OK(race.Start());
  while (!race.settled()) RunCandidate(race, 1000, 800);
  const std::vector<UnitChoice> kept = race.plan().choice;
  ASSERT_EQ(race.plan().peak_bytes, 660);
  EXPECT_FALSE(race.Measured(1000, 800).applied);  // a check that fits
  const RaceStep step = race.OutOfMemory(850);
  EXPECT_TRUE(step.applied);
  EXPECT_THAT(step.warning, HasSubstr("the budget is now 850 bytes"));
  EXPECT_FALSE(race.settled());
  EXPECT_TRUE(race.Measuring(20));
  EXPECT_FALSE(Anywhere(race, kept));
  EXPECT_EQ(race.units_budget(), 659);  // not 900 - 50
  while (!race.settled()) RunCandidate(race, 1000, 800);
  EXPECT_NE(race.plan().choice, kept);
}

// After the warm-up, a plan made when another gave way (never measured)
// fails at what the budget allowed (no distance to lower by): the next
// plan is predicted to hold less than it, never the fastest plan of the
// units' budget as it was (GPU run 128: `rrrrkkk` after `rrrrrkk`, and it
// ran out of memory too). Each plan that fails so gives way lower.
TEST(JointRaceMemoryTest, APlanOutOfMemoryAtTheBudgetGivesWayToOnePredictedLower) {
  JointRace race = FourUnits(1.0, 1000, 0, 0);
  ASSERT_OK(race.Start());
  while (!race.settled()) RunCandidate(race, 1000, 900);
  ASSERT_TRUE(race.WarmUpEnded(100) || race.settled());
  int64_t predicted = race.plan().peak_bytes;
  for (int k = 0; k < 2; ++k) {
    const std::vector<UnitChoice> failed = race.plan().choice;
    const RaceStep step = race.OutOfMemory(race.budget());
    race.WarmUpEnded(100);
    EXPECT_TRUE(step.applied) << k;
    EXPECT_FALSE(Anywhere(race, failed)) << k;
    EXPECT_LT(race.units_budget(), predicted) << k;
    EXPECT_LT(race.plan().peak_bytes, predicted) << k;
    predicted = race.plan().peak_bytes;
  }
}

// Every plan far over the budget of 700, the last resort (the recompute-
// only plan for its smallest budget) in force, and it fails: nothing is
// lower, and the plan measured lowest is kept (the budget refused),
// never the one that failed.
TEST(JointRaceMemoryTest, WhereNothingLowerFitsTheLowestMeasuredIsKeptNotTheFailedOne) {
  JointRace race = FourUnits(1.0, 700, 0, 0);
  ASSERT_OK(race.Start());
  const int plans = 1 + race.candidates().size();
  for (int k = 0; k < plans; ++k) RunCandidate(race, 1000, 9000 + k);
  ASSERT_EQ(race.plan().choice, (std::vector<UnitChoice>{R, R, R, K}));
  race.Measured(1.0, 0);
  const RaceStep step = race.OutOfMemory(9500);
  EXPECT_TRUE(step.applied);
  EXPECT_TRUE(race.settled());
  EXPECT_NE(race.plan().choice, (std::vector<UnitChoice>{R, R, R, K}));
  EXPECT_THAT(race.refusal(), HasSubstr("the smallest that fits as measured is 9000 bytes"));
  EXPECT_EQ(race.budget(), 9000);
}

// After the warm-up, every plan the race puts in force runs out of memory
// in turn at the budget, nothing measured (a device far smaller than any
// prediction): the plan that just failed is never the one put in force
// next while another is left; where none is, the smallest runs, settled,
// with a warning.
TEST(JointRaceMemoryTest, PlansOutOfMemoryInTurnLeaveTheSmallestInForceLast) {
  JointRace race = FourUnits(1.0, 1000, 0, 0);
  ASSERT_OK(race.Start());
  while (!race.settled()) RunCandidate(race, 1000, 900);
  int steps = 0;
  std::vector<UnitChoice> failed;
  RaceStep step;
  for (; steps < 40; ++steps) {
    failed = race.plan().choice;
    step = race.OutOfMemory(race.budget());
    race.WarmUpEnded(100);
    EXPECT_TRUE(step.applied) << steps;
    if (race.plan().choice == failed) break;
  }
  ASSERT_LT(steps, 40);
  EXPECT_GE(steps, 3);
  // The smallest plan: every unit but the last offloaded, one unit's
  // bytes at its peak.
  EXPECT_EQ(race.plan().choice, (std::vector<UnitChoice>{O, O, O, K}));
  EXPECT_EQ(race.plan().peak_bytes, 300);
  EXPECT_TRUE(race.settled());
  EXPECT_THAT(step.warning, HasSubstr("every plan the race can make of the units ran out"));
}

}  // namespace
}  // namespace offload
