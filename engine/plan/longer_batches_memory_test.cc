// Which plan for longer batches serves after a step out of memory
// (LongerBatches::OutOfMemory, engine/plan/longer_batches.h), on
// joint_race_testing.h's started race (recompute only, no margin).

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
#include "testing/status_matchers.h"

namespace offload {
namespace {

constexpr int kChecks = 2;

TEST(LongerBatchesTest, AStepOutOfMemoryGivesWayToAPlanPredictedLowerThenToTheLastThatRan) {
  // 300 beside the units: each plan for 1.5 that fails gives way to one
  // predicted an eighth lower, until the smallest; when it fails, the plan
  // before it, whose step ran since the length's first failure, runs again.
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.Longest(1.5));
  ASSERT_TRUE(plan.has_value());
  // The first failure at 1.5 does not take a plan that ran before it.
  ASSERT_OK_AND_ASSIGN(LongerBatches::GivingWay way, longer.OutOfMemory(plan->id, plan->id));
  EXPECT_TRUE(way.first_at_length);
  ASSERT_TRUE(way.plan.has_value());
  EXPECT_LT(way.plan->length.plan.peak_bytes, plan->length.plan.peak_bytes);
  EXPECT_TRUE(longer.CheckBegins(way.plan->id));
  EXPECT_FALSE(longer.CheckBegins(plan->id));
  EXPECT_EQ(longer.ForEveryBatch()->id, way.plan->id);
  LongerPlan previous = *plan;
  LongerPlan failing = *way.plan;
  for (int i = 0; i < 10 && way.plan.has_value(); ++i) {
    ASSERT_OK_AND_ASSIGN(way, longer.OutOfMemory(failing.id, previous.id));
    EXPECT_FALSE(way.first_at_length);
    if (way.plan.has_value()) {
      EXPECT_LT(way.plan->length.plan.peak_bytes, failing.length.plan.peak_bytes);
      previous = failing;
      failing = *way.plan;
    }
  }
  ASSERT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, previous.id);
  EXPECT_EQ(longer.ForEveryBatch()->id, previous.id);  // it takes the rung again
  // Held by the failed plan itself, or by none: it runs on.
  ASSERT_OK_AND_ASSIGN(way, longer.OutOfMemory(failing.id, failing.id));
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  ASSERT_OK_AND_ASSIGN(way, longer.OutOfMemory(failing.id, 0));
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  EXPECT_EQ(way.why.code(), StatusCode::kResourceExhausted);  // none is below it
  // The plan before it fails again: the one predicted below it is the one
  // that failed last, and is not given again.
  ASSERT_OK_AND_ASSIGN(way, longer.OutOfMemory(previous.id, 0));
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  EXPECT_OK(way.why);
}

TEST(LongerBatchesTest, AtALengthsFirstFailureAPlanThatRanBeforeItDoesNotRunAgain) {
  // At 1.2 every unit kept fits; a step of it measured far over makes the
  // smallest plan for 1.2, which runs out of memory at once. The kept plan
  // ran a whole step before that first failure, on more memory than the
  // device holds now: it is not run again, and the smallest runs on.
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> kept, longer.Longest(1.2));
  ASSERT_TRUE(kept.has_value());
  ASSERT_TRUE(longer.CheckBegins(kept->id));
  ASSERT_OK_AND_ASSIGN(LongerBatches::CheckedStep over, longer.StepChecked(kept->id, 20000));
  ASSERT_TRUE(over.plan.has_value());
  ASSERT_FALSE(over.same);
  ASSERT_GT(over.plan->length.needs_budget, 0);  // the smallest
  ASSERT_OK_AND_ASSIGN(LongerBatches::GivingWay way,
                       longer.OutOfMemory(over.plan->id, kept->id));
  EXPECT_TRUE(way.first_at_length);
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  EXPECT_EQ(way.why.code(), StatusCode::kResourceExhausted);
  // At its second failure the kept plan, had a step of it run since, runs.
  ASSERT_OK_AND_ASSIGN(way, longer.OutOfMemory(over.plan->id, kept->id));
  EXPECT_FALSE(way.first_at_length);
  EXPECT_EQ(way.again, kept->id);
  EXPECT_EQ(longer.ForEveryBatch()->id, kept->id);
}

TEST(LongerBatchesTest, TheSmallestPlanOutOfMemoryRunsOnWithWhy) {
  JointRace race = Started(1500, 100);
  LongerBatches longer(race, kChecks);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> smallest, longer.Longest(4.0));
  ASSERT_TRUE(smallest.has_value());
  const int64_t units_budget = race.units_budget();
  ASSERT_OK_AND_ASSIGN(LongerBatches::GivingWay way, longer.OutOfMemory(smallest->id, 0));
  EXPECT_TRUE(way.first_at_length);
  EXPECT_FALSE(way.plan.has_value());
  EXPECT_EQ(way.again, 0);
  EXPECT_EQ(way.why.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(race.units_budget(), units_budget);
}

TEST(LongerBatchesTest, AnUnknownPlanOutOfMemoryIsRefusedAndChangesNothing) {
  JointRace race = Started(1800, 300);
  LongerBatches longer(race, kChecks);
  EXPECT_EQ(longer.OutOfMemory(3, 0).status().code(), StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::optional<LongerPlan> plan, longer.Longest(1.5));
  ASSERT_TRUE(plan.has_value());
  const int64_t units_budget = race.units_budget();
  EXPECT_EQ(longer.OutOfMemory(plan->id + 1, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(race.units_budget(), units_budget);
  // 1.5's first failure is still to come.
  ASSERT_OK_AND_ASSIGN(LongerBatches::GivingWay way, longer.OutOfMemory(plan->id, 0));
  EXPECT_TRUE(way.first_at_length);
}

}  // namespace
}  // namespace offload
