// The race lowering the units' budget (engine/plan/joint_race.h): where
// every trial is over, where a faster trial is over, where no plan can be
// lowered, and where the kept plan's check is over. The units and scripts
// are joint_race_testing.h's.

#include <algorithm>
#include <cstdint>
#include <map>
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

// Budget 1000 with the 1% margin: the units get 990. Every candidate is
// over, the least by 20 bytes: they get 990 - 20 - 10 = 960, planned anew.
TEST(JointRaceTest, AllOverLowersTheUnitsByTheLeastExcess) {
  JointRace race = FourUnits(1.0, 1000, 0, 0.01);
  ASSERT_OK(race.Start());
  EXPECT_EQ(race.units_budget(), 990);
  const int plans = 1 + race.candidates().size();
  ASSERT_GE(plans, 2);
  RaceStep last;
  for (int k = 0; k < plans; ++k) {
    last = RunCandidate(race, 1000 + k, k == plans - 1 ? 1020 : 1050 + k);
  }
  EXPECT_TRUE(last.applied);
  EXPECT_THAT(last.warning, IsEmpty());
  EXPECT_EQ(race.units_budget(), 960);
  EXPECT_FALSE(race.settled());
  EXPECT_TRUE(race.trials().empty());  // a new race
  EXPECT_EQ(race.all_trials().size(), static_cast<size_t>(plans));
  EXPECT_LE(race.plan().peak_bytes, 960);
  EXPECT_EQ(race.race_plan().budget, 960);
}

// The joint plan runs fastest but 10 bytes over; the others fit, slower.
// The units' budget drops to the joint plan's predicted peak less the excess
// and the margin, and a new race runs with the fitting trials kept (not run
// again); where its plans measure slower, the fastest that fit is kept.
TEST(JointRaceTest, AFasterTrialOverTheBudgetLowersAndRacesAgainKeepingThoseThatFit) {
  JointRace race = FourUnits(1.0, 1000, 0, 0.01);
  ASSERT_OK(race.Start());
  const int plans = 1 + race.candidates().size();
  ASSERT_GE(plans, 2);
  const int64_t predicted = race.plan().peak_bytes;
  const std::string second = Choices(race.candidates()[0].plan);
  RaceStep last = RunCandidate(race, 900, 1010);
  for (int k = 1; k < plans; ++k) last = RunCandidate(race, 1000 + k, 950);
  EXPECT_TRUE(last.applied);
  EXPECT_FALSE(race.settled());
  EXPECT_EQ(race.units_budget(), std::min<int64_t>(990, predicted) - 10 - 10);
  ASSERT_EQ(race.trials().size(), static_cast<size_t>(plans - 1));
  for (const RaceTrial& t : race.trials()) {
    EXPECT_LE(t.peak_bytes, 1000);
    EXPECT_NE(Choices(t.plan.plan), Choices(race.plan()));
    for (const RacePlan& c : race.candidates()) {
      EXPECT_NE(Choices(c.plan), Choices(t.plan.plan));
    }
  }
  const int again = 1 + race.candidates().size();
  for (int k = 0; k < again; ++k) last = RunCandidate(race, 2000, 900);
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(Choices(race.plan()), second);
}

// No faster trial over the budget is worth a new race when it gains less
// than worth_lowering (2%): the fastest that fits is kept at once.
TEST(JointRaceTest, AFasterTrialOverTheBudgetByTooLittleIsNotRacedAgain) {
  JointRace race = FourUnits(1.0, 1000, 0, 0.01);
  ASSERT_OK(race.Start());
  const int plans = 1 + race.candidates().size();
  RaceStep last = RunCandidate(race, 995, 1010);
  for (int k = 1; k < plans; ++k) last = RunCandidate(race, 1000 + k, 950);
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(race.units_budget(), 990);
}

// Far over whatever the plan: the units' budget cannot go below the
// smallest (300). The recompute-only plan for its smallest budget runs
// last, over too, so the plan measured lowest is kept and the caller's
// budget refused (SPEC 7.8), naming that plan's measured peak, which
// becomes the budget.
TEST(JointRaceTest, WhereNoPlanCanBeLoweredTheLowestMeasuredIsKept) {
  JointRace race = FourUnits(1.0, 700);
  ASSERT_OK(race.Start());
  const int plans = 1 + race.candidates().size();
  std::vector<std::string> ran;
  RaceStep last;
  for (int k = 0; k < plans; ++k) {
    ran.push_back(Choices(race.plan()));
    last = RunCandidate(race, 1000, k == 1 ? 9000 : 9500);
  }
  EXPECT_TRUE(last.applied);
  EXPECT_THAT(last.warning, IsEmpty());
  EXPECT_FALSE(race.settled());
  EXPECT_EQ(Choices(race.plan()), "RRRK");  // the last resort
  EXPECT_THAT(race.refusal(), IsEmpty());
  last = RunCandidate(race, 1000, 9500);
  EXPECT_THAT(last.warning, IsEmpty());
  EXPECT_EQ(race.refusal(),
            "actoffload: a budget of 700 bytes cannot be kept as measured "
            "(every plan the warm-up ran measured over it); the smallest that "
            "fits as measured is 9000 bytes, planned for that instead");
  EXPECT_EQ(race.budget(), 9000);
  EXPECT_TRUE(last.applied);
  EXPECT_EQ(Choices(race.plan()), ran[1]);
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(race.checks_left(), 0);
  EXPECT_FALSE(race.Measuring((plans + 1) * 3 + 2));
  EXPECT_EQ(race.units_budget(), 700);
}

// The same, but the last resort measures within the budget: it is kept and
// checked, without a warning. Without recompute there is no last resort.
TEST(JointRaceTest, WhereNoPlanCanBeLoweredTheRecomputeOnlySmallestIsTriedLast) {
  JointRace race = FourUnits(1.0, 700);
  ASSERT_OK(race.Start());
  const int plans = 1 + race.candidates().size();
  for (int k = 0; k < plans; ++k) RunCandidate(race, 1000, 9000 + k);
  ASSERT_EQ(Choices(race.plan()), "RRRK");
  const RaceStep last = RunCandidate(race, 1400, 650);
  EXPECT_TRUE(last.applied);
  EXPECT_THAT(last.warning, IsEmpty());
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(race.checks_left(), 4);
  EXPECT_EQ(Choices(race.plan()), "RRRK");

  JointRaceOptions options;
  options.margin = 0;
  options.fit_excess = false;
  options.prune = kNoPrune;
  JointRace offload_only(Stack(4, 1.0, 1).units, 1.0, 1.0, 700, 0,
                         /*allow_offload=*/true, /*allow_recompute=*/false,
                         {0, 1, 2, 3}, options);
  ASSERT_OK(offload_only.Start());
  RaceStep end;
  for (int k = 0; k < 1 + static_cast<int>(offload_only.candidates().size()); ++k) {
    end = RunCandidate(offload_only, 1000, 9000);
  }
  EXPECT_THAT(offload_only.refusal(), HasSubstr("cannot be kept as measured"));
  EXPECT_TRUE(offload_only.settled());
}

// A kept plan whose check reads 50 bytes over: 900 - 50 = 850, planned
// anew, and the race runs again.
TEST(JointRaceTest, AKeptPlanOverInItsCheckIsLoweredAndRacedAgain) {
  JointRace race = FourUnits(1.0, 900);
  ASSERT_OK(race.Start());
  while (!race.settled()) RunCandidate(race, 1000, 800);
  EXPECT_EQ(race.checks_left(), 4);
  EXPECT_FALSE(race.Measured(1000, 900).applied);  // at the budget: fits
  EXPECT_EQ(race.checks_left(), 3);
  RaceStep over = race.Measured(1000, 950);
  EXPECT_TRUE(over.applied);
  EXPECT_EQ(race.units_budget(), 850);
  EXPECT_FALSE(race.settled());
  EXPECT_TRUE(race.Measuring(20));
  EXPECT_LE(race.plan().peak_bytes, 850);
  EXPECT_TRUE(race.trials().empty());
}

// A kept plan's check reads far over, where no plan of the units is
// smaller (its excess, 8100, would take the units' budget under the
// smallest): the check's peak is that plan's, and the plan measured lowest
// is kept and the budget refused, as where the race gives up.
TEST(JointRaceTest, AKeptPlanOverInItsCheckThatCannotBeLoweredRefusesTheBudget) {
  JointRace race = FourUnits(1.0, 900);
  ASSERT_OK(race.Start());
  while (!race.settled()) RunCandidate(race, 1000, 800);
  ASSERT_GE(race.all_trials().size(), 2u);
  const std::string kept = Choices(race.plan());
  RaceStep over = race.Measured(1000, 9000);
  EXPECT_TRUE(over.applied);
  EXPECT_THAT(over.warning, IsEmpty());
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(race.checks_left(), 0);
  EXPECT_NE(Choices(race.plan()), kept);
  for (const RaceTrial& t : race.all_trials()) {
    if (Choices(t.plan.plan) == kept) {
      EXPECT_EQ(t.peak_bytes, 9000);
    } else if (Choices(t.plan.plan) == Choices(race.plan())) {
      EXPECT_EQ(t.peak_bytes, 800);
    }
  }
  EXPECT_THAT(race.refusal(), HasSubstr("a budget of 900 bytes cannot be kept as measured"));
  EXPECT_EQ(race.budget(), 800);
}

}  // namespace
}  // namespace offload
