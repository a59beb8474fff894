// The byte-budget plan (SPEC §4.7) on hand-made and random recordings.

#include "engine/plan/budget_plan.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;

// `layers` layers of `per_layer` units of `bytes` each, pushed one per call
// in order; backward: BackwardStep(layer) then a Pop of each unit in
// reverse push order, for layers n-1..0 (autograd's order). A kept unit's
// memory goes at the next BackwardStep (the layer's handles dropped), an
// offloaded one's at the call after its pop.
BudgetRecording Stack(int layers, int per_layer, int64_t bytes) {
  BudgetRecording r;
  r.layers = layers;
  r.forward_pushes = layers * per_layer;
  std::vector<int> step_call(layers);
  std::vector<std::vector<int>> pop_call(layers, std::vector<int>(per_layer));
  int call = 0;
  for (int l = layers - 1; l >= 0; --l) {
    step_call[l] = call++;
    for (int u = per_layer - 1; u >= 0; --u) pop_call[l][u] = call++;
  }
  r.backward_calls = call;
  for (int l = 0; l < layers; ++l) {
    for (int u = 0; u < per_layer; ++u) {
      BudgetUnit unit;
      unit.layer = l;
      unit.bytes = bytes;
      unit.first_push = unit.last_push = l * per_layer + u;
      unit.dropped_at = unit.last_push + 1;  // by the next push
      unit.first_use = pop_call[l][u];
      unit.free_at = l > 0 ? step_call[l - 1] : call;
      unit.done_at = pop_call[l][u] + 1;
      r.units.push_back(unit);
    }
  }
  return r;
}

TEST(BudgetPlanTest, AmpleBudgetOffloadsNothing) {
  const BudgetRecording r = Stack(4, 3, 100);
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 1200));
  EXPECT_EQ(plan.OffloadedBytes(r), 0);
  EXPECT_EQ(plan.peak_bytes, 1200);
  EXPECT_OK(ValidateBudgetPlan(plan, r));
}

// 4 layers x 3 units of 100 bytes, budget 700: unit 7 (push 7) needs room
// at the end of push 6, which releases unit 0; and so on: units 0..4 go to
// host, each released one push after the next needs it.
TEST(BudgetPlanTest, ReleasesEarliestPushedJustInTime) {
  const BudgetRecording r = Stack(4, 3, 100);
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 700));
  EXPECT_OK(ValidateBudgetPlan(plan, r));
  EXPECT_EQ(plan.peak_bytes, 700);
  for (int u = 0; u < 12; ++u) {
    EXPECT_EQ(plan.offloaded[u], u < 5) << "unit " << u;
    if (u < 5) {
      EXPECT_EQ(plan.release_at[u], u + 6) << "unit " << u;
    }
  }
  // Backward: layer 3's BackwardStep is call 0 (700 bytes on device); its
  // units go at call 4 (layer 2's step): then units 4, 3 and 2 come back at
  // once, in order of use (700 bytes again); units 1 and 0 once layer 2's
  // go at call 8.
  EXPECT_EQ(plan.reload_at[4], 4);
  EXPECT_EQ(plan.reload_at[3], 4);
  EXPECT_EQ(plan.reload_at[2], 4);
  EXPECT_EQ(plan.reload_at[1], 8);
  EXPECT_EQ(plan.reload_at[0], 8);
}

// SPEC §4.8: layer 1 is recomputed, and its 200 re-created bytes are held
// outside the engine during its backward (calls 8..11). The plan of the
// test above brings units 1 and 0 back at call 8; now unit 1 still fits
// there (400 + 200 + 100), but unit 0 waits for call 11, where unit 4 went.
TEST(BudgetPlanTest, BytesHeldOutsideDelayReloads) {
  BudgetRecording r = Stack(4, 3, 100);
  r.held_outside.assign(r.backward_calls, 0);
  for (int c = 8; c < 12; ++c) r.held_outside[c] = 200;
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 700));
  EXPECT_OK(ValidateBudgetPlan(plan, r));
  EXPECT_EQ(plan.peak_bytes, 700);
  EXPECT_EQ(plan.reload_at[1], 8);
  EXPECT_EQ(plan.reload_at[0], 11);
  // The replay counts them: the plan made without them exceeds the budget.
  BudgetRecording without = r;
  without.held_outside.clear();
  ASSERT_OK_AND_ASSIGN(BudgetPlan blind, PlanBudget(without, 700));
  EXPECT_THAT(ValidateBudgetPlan(blind, r).message(),
              HasSubstr("at backward call 8 (200 held outside)"));
  // More than the budget leaves for them is a clear error.
  r.held_outside[9] = 650;
  EXPECT_THAT(PlanBudget(r, 700).status().message(),
              HasSubstr("at backward call 9, 750 bytes are on device (650 of "
                        "them held outside)"));
  r.held_outside.pop_back();
  EXPECT_THAT(ValidateRecording(r).message(), HasSubstr("held_outside"));
}

// SPEC §4.7 with a probe: bytes outside the engine in the forward (here the
// last layer's output, next to push 11) take room the plan makes by
// releasing one more unit; the smallest budget counts them.
TEST(BudgetPlanTest, BytesOutsideInTheForwardReleaseEarlier) {
  BudgetRecording r = Stack(4, 3, 100);
  r.forward_outside.assign(r.forward_pushes, 0);
  r.forward_outside[11] = 100;
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 700));
  EXPECT_OK(ValidateBudgetPlan(plan, r));
  EXPECT_EQ(plan.peak_bytes, 700);
  for (int u = 0; u < 12; ++u) {
    EXPECT_EQ(plan.offloaded[u], u < 6) << "unit " << u;
  }
  EXPECT_EQ(plan.release_at[5], 10);
  // The replay counts them: the plan made without them exceeds the budget.
  BudgetRecording without = r;
  without.forward_outside.clear();
  ASSERT_OK_AND_ASSIGN(BudgetPlan blind, PlanBudget(without, 700));
  EXPECT_THAT(ValidateBudgetPlan(blind, r).message(),
              HasSubstr("800 bytes on device at push 11 (100 outside"));
  ASSERT_OK_AND_ASSIGN(int64_t smallest_without, SmallestBudget(without));
  r.forward_outside[11] = 1000;
  ASSERT_OK_AND_ASSIGN(int64_t smallest, SmallestBudget(r));
  // The output next to units 11 and 10 (dropped at push 11, after which
  // nothing is released).
  EXPECT_EQ(smallest, 1200);
  EXPECT_LT(smallest_without, smallest);
  EXPECT_THAT(PlanBudget(r, smallest - 1),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("unit 11 (layer 3")));
  // Outside bytes at a push that starts no unit: their own message.
  BudgetRecording shared = Stack(2, 1, 100);
  shared.units[1].first_push = 0;
  shared.units[0].dropped_at = shared.units[1].dropped_at = 2;
  shared.units[0].layer = 1;
  shared.forward_outside = {0, 950};
  EXPECT_THAT(PlanBudget(shared, 1000).status().message(),
              HasSubstr("at push 1, 950 bytes outside the engine while 200"));
  r.forward_outside.pop_back();
  EXPECT_THAT(ValidateRecording(r).message(), HasSubstr("forward_outside"));
  r.forward_outside.push_back(-1);
  EXPECT_THAT(ValidateRecording(r).message(), HasSubstr("forward_outside"));
}

TEST(BudgetPlanTest, TooSmallBudgetNamesTheUnit) {
  const BudgetRecording r = Stack(2, 2, 100);
  // A unit is dropped by the push after its own: two units must fit at
  // once.
  EXPECT_THAT(PlanBudget(r, 199),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("unit 1 (layer 0")));
  EXPECT_OK(PlanBudget(r, 200).status());
  EXPECT_THAT(PlanBudget(r, 0), StatusIs(StatusCode::kInvalidArgument));
}

// A unit the caller still holds frees nothing when released: the plan
// takes a later one the caller dropped, and fails when there is none.
TEST(BudgetPlanTest, SkipsUnitsTheCallerStillHolds) {
  BudgetRecording r = Stack(3, 2, 100);
  r.units[0].dropped_at = r.forward_pushes;  // held through the forward
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 300));
  EXPECT_OK(ValidateBudgetPlan(plan, r));
  EXPECT_FALSE(plan.offloaded[0]);
  EXPECT_TRUE(plan.offloaded[1]);
  EXPECT_EQ(plan.release_at[1], 2);
  BudgetPlan bad = plan;
  bad.offloaded[0] = true;
  bad.release_at[0] = 3;
  bad.reload_at[0] = r.units[0].first_use;
  EXPECT_THAT(ValidateBudgetPlan(bad, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("its drop")));
  for (BudgetUnit& unit : r.units) unit.dropped_at = r.forward_pushes;
  EXPECT_THAT(PlanBudget(r, 300), StatusIs(StatusCode::kResourceExhausted));
}

TEST(BudgetPlanTest, ValidateCatchesBrokenPlans) {
  const BudgetRecording r = Stack(4, 3, 100);
  ASSERT_OK_AND_ASSIGN(const BudgetPlan good, PlanBudget(r, 700));
  BudgetPlan plan = good;
  plan.release_at[0] = 0;  // released before the caller dropped it
  EXPECT_THAT(ValidateBudgetPlan(plan, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unit 0")));
  plan = good;
  plan.release_at[4] += 1;  // too late: push 11 finds 800 bytes
  EXPECT_THAT(ValidateBudgetPlan(plan, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("800 bytes")));
  plan = good;
  plan.reload_at[1] = 4;  // early: 800 bytes in the backward
  EXPECT_THAT(ValidateBudgetPlan(plan, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("backward")));
  plan = good;
  plan.reload_at[0] = r.units[0].first_use + 1;  // after its first use
  EXPECT_THAT(ValidateBudgetPlan(plan, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("first used")));
  plan = good;
  plan.peak_bytes = 600;
  EXPECT_THAT(ValidateBudgetPlan(plan, r),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("replayed")));
}

TEST(BudgetPlanTest, RecordingIsChecked) {
  BudgetRecording r = Stack(2, 2, 100);
  r.units[2].first_push = 0;
  EXPECT_THAT(PlanBudget(r, 1000),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unit 2")));
  r = Stack(2, 2, 100);
  r.units[1].free_at = r.units[1].first_use;
  EXPECT_THAT(PlanBudget(r, 1000),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unit 1")));
}

TEST(BudgetPlanTest, FormatShowsEveryUnitAndTheTotals) {
  const BudgetRecording r = Stack(4, 3, 100);
  ASSERT_OK_AND_ASSIGN(BudgetPlan plan, PlanBudget(r, 700));
  const std::string text = FormatBudgetPlan(plan, r);
  EXPECT_THAT(text, HasSubstr("offloaded 500 of 1200 bytes"));
  EXPECT_THAT(text, HasSubstr("peak on device 700 bytes, budget 700"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 14);
}

// RapidCheck's counterexample (seed 4840092986683921900), 5 layers of 3:
// at 1769 the forward releases units 0..10; at 2269 it keeps unit 10 (876
// bytes, layer 3) beside unit 11, and unit 9's reload (893 bytes, first
// used at call 7) fits nowhere next to them (1522 bytes kept until layer
// 2's step). Unit 10, gone by call 7 once reloaded instead of kept, goes
// to host too, and 2269 plans with no more offloaded than 1769.
TEST(BudgetPlanTest, AReloadBlockedByKeptUnitsOfItsLayerSendsOneToHost) {
  BudgetRecording r = Stack(5, 3, 1);
  const int64_t bytes[] = {770, 407, 304, 103, 183, 590, 184, 839,
                           86,  893, 876, 646, 180, 1,   339};
  for (int i = 0; i < 15; ++i) r.units[i].bytes = bytes[i];
  ASSERT_OK_AND_ASSIGN(BudgetPlan smaller, PlanBudget(r, 1769));
  ASSERT_OK_AND_ASSIGN(BudgetPlan larger, PlanBudget(r, 2269));
  EXPECT_OK(ValidateBudgetPlan(larger, r));
  EXPECT_TRUE(larger.offloaded[10]);
  EXPECT_EQ(larger.release_at[10], r.forward_pushes - 1);
  EXPECT_FALSE(larger.offloaded[11]);
  EXPECT_LE(larger.OffloadedBytes(r), smaller.OffloadedBytes(r));
  EXPECT_LE(larger.peak_bytes, 2269);
}

// Random stacks of random unit sizes: every plan PlanBudget makes passes
// the independent check, stays within the budget, and a larger budget
// never offloads more.
RC_GTEST_PROP(BudgetPlanProperties, PlansAreValidAndMonotone, ()) {
  const int layers = *rc::gen::inRange(1, 7);
  const int per_layer = *rc::gen::inRange(1, 5);
  BudgetRecording r = Stack(layers, per_layer, 1);
  int64_t total = 0;
  for (BudgetUnit& unit : r.units) {
    unit.bytes = *rc::gen::inRange<int64_t>(1, 1000);
    total += unit.bytes;
  }
  // Bytes outside the engine (a probe's, SPEC §4.7), in half the cases.
  if (*rc::gen::arbitrary<bool>()) {
    for (int q = 0; q < r.forward_pushes; ++q) {
      r.forward_outside.push_back(*rc::gen::inRange<int64_t>(0, 300));
    }
    for (int c = 0; c < r.backward_calls; ++c) {
      r.held_outside.push_back(*rc::gen::inRange<int64_t>(0, 300));
    }
    r.outside_counts_drops = *rc::gen::arbitrary<bool>();
  }
  const int64_t budget = *rc::gen::inRange<int64_t>(1, total + 302);
  StatusOr<BudgetPlan> plan = PlanBudget(r, budget);
  if (!plan.ok()) {
    RC_ASSERT(plan.status().code() == StatusCode::kResourceExhausted);
    return;
  }
  RC_ASSERT(ValidateBudgetPlan(*plan, r).ok());
  RC_ASSERT(plan->peak_bytes <= budget);
  StatusOr<BudgetPlan> bigger = PlanBudget(r, budget + 500);
  RC_ASSERT(bigger.ok());
  RC_ASSERT(bigger->OffloadedBytes(r) <= plan->OffloadedBytes(r));
}

}  // namespace
}  // namespace offload
