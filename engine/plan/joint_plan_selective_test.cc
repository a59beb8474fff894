// The joint plan's fourth choice, selective recompute (SPEC §4.8;
// engine/plan/joint_plan.h), on cases worked by hand in the comments, and the
// greedy search's property with selective units. The properties of
// joint_plan_test.cc and joint_limit_test.cc cover it over small random
// problems too (GenUnitCost makes selective units).

#include <string>
#include <vector>

#include "engine/plan/joint_limit.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Selective recompute (SPEC §4.8). SelectiveStack(3, 0.1, 600): each unit
// may keep 60 of its 300 bytes and re-run its cheap ops in 10 ns, where a
// full re-run takes 100 ns. Copies are too slow to help (3000 ns each).
//  - Selective units 0 and 1: forward 60 + 60 + 300 = 420; backward: unit
//    2 with 420 on device, unit 1 with 60 + 60 + 240 re-created = 360,
//    unit 0 with 300. Step 900 + 2 x 10 = 920.
//  - One re-run unit is too few (300 + 300 + 60 > 600), so full recompute
//    of units 0 and 1 (SlowCopiesMakeRecomputeWin) is the best without
//    selective: 1100.
TEST(JointPlanTest, PicksSelectiveWhereItsReRunIsCheap) {
  JointProblem p = SelectiveStack(3, 0.1, 600);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(S, S, K));
  EXPECT_TRUE(plan.Selective(0));
  EXPECT_FALSE(plan.Recompute(0));
  EXPECT_DOUBLE_EQ(plan.step_ns, 920);
  EXPECT_DOUBLE_EQ(plan.selective_ns, 20);
  EXPECT_DOUBLE_EQ(plan.recompute_ns, 0);
  EXPECT_EQ(plan.peak_bytes, 420);
  EXPECT_OK(ValidateJointPlan(plan, p));
  // Every unit recomputed in full fits too, and is slower.
  ASSERT_OK_AND_ASSIGN(JointPlan full, EvaluateJoint(p, {R, R, R}));
  EXPECT_GT(full.step_ns, plan.step_ns);
  // Where selective is not allowed it is never chosen.
  for (UnitCost& u : p.units) u.selective = false;
  ASSERT_OK_AND_ASSIGN(plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(R, R, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 1100);
  EXPECT_DOUBLE_EQ(plan.selective_ns, 0);
  p = SelectiveStack(3, 0.1, 600);
  p.units[0].selective = false;  // only unit 1 or 2 may: 300 + 60 + 60
  ASSERT_OK_AND_ASSIGN(plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(R, S, K));
  // An offload-only problem re-runs nothing, selective or not.
  p = SelectiveStack(3, 0.1, 600);
  p.allow_recompute = false;
  ASSERT_OK_AND_ASSIGN(plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(O, K, K));
  EXPECT_THAT(EvaluateJoint(p, {S, K, K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: selective but recompute not "
                                 "allowed")));
}

// Checkpointing only. Unit 0 (300 bytes) recomputed in full keeps its
// 30-byte input and re-creates all 300 bytes beside it: 330 in its
// backward; selective, it keeps 100 and re-creates 200: 300. Unit 1 (150
// bytes) cannot be recomputed. Budget 320:
//  - keep both: 450 in unit 1's forward;
//  - recompute unit 0: forward 180, but 330 in unit 0's backward;
//  - selective unit 0: forward 100 + 150, backward 250 then 300. It fits.
TEST(JointPlanTest, ABudgetOnlySelectiveMeetsIsMet) {
  JointProblem p = SelectiveStack(2, 1.0, 320, /*kept=*/100, /*ns=*/40);
  p.allow_offload = false;
  p.units[0].recompute_bytes = 300;
  p.units[1].saved_bytes = 150;
  p.units[1].recomputable = false;
  p.units[1].selective = false;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(S, K));
  EXPECT_EQ(plan.peak_bytes, 300);
  EXPECT_DOUBLE_EQ(plan.step_ns, 600 + 40);
  EXPECT_THAT(EvaluateJoint(p, {R, K}).status().message(),
              HasSubstr("while unit 0 runs, 330"));
  EXPECT_THAT(SmallestJointBudget(p), IsOkAndHolds(300));
  p.units[0].selective = false;
  EXPECT_EQ(PlanJoint(p).status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(SmallestJointBudget(p), IsOkAndHolds(330));
}

// Units 0..2 of 300 bytes, nothing released (roomy, checkpointing only);
// unit 1 selective keeps 100 bytes and re-runs in 40 ns.
//  - Forward: 300 + 100 + 300 = 700, the peak (saved_bytes would be 900).
//  - Backward: unit 2 with 700; unit 1 with 300 + 100 + 200 re-created =
//    600; unit 0 with 300. Step 900 + 40.
//  - Its backward's peak follows recompute's rule: 350 bytes of
//    temporaries make it 950; a forward transient of 400 (re-run before
//    the backward) 1000.
TEST(JointPlanTest, EvaluatingASelectiveUnitCountsItsBytesAndTime) {
  JointProblem p = SelectiveStack(3, 1.0, 10000, /*kept=*/100, /*ns=*/40);
  p.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_THAT(plan.choice, ElementsAre(K, S, K));
  EXPECT_EQ(plan.peak_bytes, 700);
  EXPECT_DOUBLE_EQ(plan.step_ns, 940);
  EXPECT_DOUBLE_EQ(plan.selective_ns, 40);
  EXPECT_DOUBLE_EQ(plan.recompute_ns, 0);
  p.budget = 699;
  EXPECT_THAT(EvaluateJoint(p, {K, S, K}).status().message(),
              HasSubstr("too small in the forward: unit 2"));
  p.budget = 10000;
  p.units[1].backward_transient_bytes = 350;
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_EQ(plan.peak_bytes, 950);
  p.budget = 949;
  EXPECT_THAT(EvaluateJoint(p, {K, S, K}).status().message(),
              HasSubstr("while unit 1 runs, 950"));
  p.budget = 10000;
  p.units[1].backward_transient_bytes = 0;
  p.units[1].forward_transient_bytes = 400;
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_EQ(plan.peak_bytes, 1000);
  // Keep and offload in the choice follow from the forward rule.
  ASSERT_OK_AND_ASSIGN(JointPlan same, EvaluateJoint(p, {O, S, O}));
  EXPECT_THAT(same.choice, ElementsAre(K, S, K));
}

// What a selective unit holds for a moment beyond the unit's transients
// (measured by the PyTorch package's selective profile: the cheap ops'
// outputs alive in its forward, its re-run's temporaries in its backward).
// SelectiveStack(3, ...) keeping 100 bytes, no offloading, K S K: the
// forward peaks at unit 2 (300 + 100 + 300 = 700); unit 1's backward
// holds 300 + 100 + 200 re-created = 600.
//  - A selective forward transient of 450 raises unit 1's forward to
//    300 + 100 + 450 = 850; kept, unit 1 ignores it (900 at unit 2).
//  - A selective backward transient of 250: unit 1's backward peaks at
//    600 + 250 = 850, above the forward transient 200 it also re-runs.
// The limit (joint_limit.h) counts them as the model does.
TEST(JointPlanTest, ASelectiveUnitsOwnTransientsRaiseItsPeaks) {
  JointProblem p = SelectiveStack(3, 1.0, 10000, /*kept=*/100, /*ns=*/40);
  p.allow_offload = false;
  p.units[1].selective_forward_transient_bytes = 450;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_EQ(plan.peak_bytes, 850);
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, K, K}));
  EXPECT_EQ(plan.peak_bytes, 900);

  p = SelectiveStack(3, 1.0, 10000, /*kept=*/100, /*ns=*/40);
  p.allow_offload = false;
  p.units[1].forward_transient_bytes = 200;
  p.units[1].selective_backward_transient_bytes = 250;
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_EQ(plan.peak_bytes, 850);
  p.budget = 849;
  EXPECT_THAT(EvaluateJoint(p, {K, S, K}).status().message(),
              HasSubstr("while unit 1 runs, 850"));
  // The limit refuses it at 849 too; in full it re-creates 270 beside
  // 300 + 30 with the transient 200: 800.
  EXPECT_THAT(JointChoiceBound(p, {K, S, K}),
              StatusIs(StatusCode::kResourceExhausted));
  EXPECT_OK(JointChoiceBound(p, {K, R, K}).status());
  p.units[1].selective_backward_transient_bytes = -1;
  EXPECT_THAT(ValidateJointProblem(p).message(),
              HasSubstr("unit 1: selective transients must not be negative"));
}

// A unit recomputed in full holds its intermediates while its forward
// runs (measured by the PyTorch package in a profile iteration that
// recomputes every unit: recompute_forward_transient_bytes). Stack(3, ...)
// without offloading, K R K: unit 1 keeps its 30-byte input; with a
// recomputed forward's transient of 450 its forward peaks at 300 + 30 +
// 450 = 780, above unit 2's 630 and its backward's 300 + 30 + 270 = 600.
// Kept, unit 1 ignores it (900 at unit 2). The limit counts it too.
TEST(JointPlanTest, ARecomputedUnitsForwardTransientRaisesItsForwardPeak) {
  JointProblem p = Stack(3, 1.0, 10000);
  p.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, EvaluateJoint(p, {K, R, K}));
  EXPECT_EQ(plan.peak_bytes, 630);
  p.units[1].recompute_forward_transient_bytes = 450;
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, R, K}));
  EXPECT_EQ(plan.peak_bytes, 780);
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {K, K, K}));
  EXPECT_EQ(plan.peak_bytes, 900);
  p.budget = 779;
  EXPECT_THAT(EvaluateJoint(p, {K, R, K}).status().message(),
              HasSubstr("too small in the forward: unit 1"));
  EXPECT_THAT(JointChoiceBound(p, {K, R, K}),
              StatusIs(StatusCode::kResourceExhausted));
  p.budget = 780;
  EXPECT_OK(JointChoiceBound(p, {K, R, K}).status());
  p.units[1].recompute_forward_transient_bytes = -1;
  EXPECT_THAT(ValidateJointProblem(p).message(),
              HasSubstr("unit 1: recompute_forward_transient_bytes must not be "
                        "negative"));
}

// A selective unit is never released for room: budget 500 with copies of
// 30 ns. Unit 2's 300 bytes beside units 0 and 1 make 660: unit 1,
// selective (60 bytes), stays, and unit 0 goes to host.
TEST(JointPlanTest, ASelectiveUnitIsNeverOffloaded) {
  JointProblem p = SelectiveStack(3, 10.0, 500);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, EvaluateJoint(p, {K, S, K}));
  EXPECT_THAT(plan.choice, ElementsAre(O, S, K));
  EXPECT_EQ(plan.offloaded_bytes, 300);
}

// Selective-offload: a selective unit whose kept bytes, but its input,
// go to host. SelectiveStack(3, 0.5, 650) keeping 100 bytes (30 of them
// its input) in 40 ns; copies at 0.5 bytes per ns.
//  - {selective-offload, K, K}: forward 100 + 300, and unit 2's 300 make
//    700 > 650: the forward rule releases unit 0 (the earliest it may),
//    whose 70 bytes leave in 140 ns, long before unit 2 needs the room
//    (at 200 + 250/300 of 100 ns). Peak 30 + 300 + 300 = 630.
//  - Backward: unit 2 with 630; unit 0's 70 bytes come back during unit
//    1's (330 + 70 = 400; during unit 2's, 700 would not fit), from 500 to
//    640, before unit 0's backward (700): 30 + 70 + 200 re-created = 300.
//    Step 900 + 40 = 940.
//  - Selective alone, unit 1 (kept) goes instead: 300 bytes from 100 to
//    700, and unit 2 waits for them. Offloading unit 0 whole: 600 ns,
//    stalls too; recompute: 1000; units 0 and 1 selective: 980. PlanJoint
//    picks selective-offload; without offloading, {S, S, K}.
//  - With room to spare, the rule releases nothing and the unit is
//    selective, kept on device.
TEST(JointPlanTest, ASelectiveOffloadUnitSendsItsKeptBytesButItsInput) {
  JointProblem p = SelectiveStack(3, 0.5, 650, /*kept=*/100, /*ns=*/40);
  const UnitChoice SO = UnitChoice::kSelectiveOffload;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, EvaluateJoint(p, {SO, K, K}));
  EXPECT_THAT(plan.choice, ElementsAre(SO, K, K));
  EXPECT_TRUE(plan.Selective(0));
  EXPECT_EQ(plan.offloaded_bytes, 70);
  EXPECT_EQ(plan.peak_bytes, 630);
  EXPECT_EQ(plan.released_during[0], 2);
  EXPECT_EQ(plan.reloaded_during[0], 1);
  EXPECT_DOUBLE_EQ(plan.stall_ns, 0);
  EXPECT_DOUBLE_EQ(plan.selective_ns, 40);
  EXPECT_DOUBLE_EQ(plan.step_ns, 940);
  EXPECT_OK(ValidateJointPlan(plan, p));
  EXPECT_THAT(FormatJointPlan(plan, p), HasSubstr("selective-offload"));

  ASSERT_OK_AND_ASSIGN(JointPlan kept, EvaluateJoint(p, {S, K, K}));
  EXPECT_THAT(kept.choice, ElementsAre(S, O, K));
  EXPECT_GT(kept.stall_ns, 0);
  ASSERT_OK_AND_ASSIGN(JointPlan best, PlanJoint(p));
  EXPECT_THAT(best.choice, ElementsAre(SO, K, K));
  EXPECT_DOUBLE_EQ(best.step_ns, 940);
  // The limit counts the same 70 bytes out and back: no choice beats it.
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_LE(limit.step_ns, best.step_ns);
  EXPECT_GE(limit.step_ns, 900);
  ASSERT_OK_AND_ASSIGN(double bound, JointChoiceBound(p, {SO, K, K}));
  EXPECT_DOUBLE_EQ(bound, 940);

  JointProblem no_offload = p;
  no_offload.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(best, PlanJoint(no_offload));
  EXPECT_THAT(best.choice, ElementsAre(S, S, K));
  EXPECT_DOUBLE_EQ(best.step_ns, 980);

  p.budget = 10000;
  ASSERT_OK_AND_ASSIGN(plan, EvaluateJoint(p, {SO, K, K}));
  EXPECT_THAT(plan.choice, ElementsAre(S, K, K));
  EXPECT_EQ(plan.offloaded_bytes, 0);
  EXPECT_OK(ValidateJointPlan(plan, p));
}

TEST(JointPlanTest, ASelectiveOffloadUnitMustBeOffloadable) {
  JointProblem p = SelectiveStack(2, 1.0, 600);
  const UnitChoice SO = UnitChoice::kSelectiveOffload;
  p.units[0].offloadable = false;
  EXPECT_THAT(EvaluateJoint(p, {SO, K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: selective-offload but not "
                                 "offloadable")));
  EXPECT_THAT(JointChoiceBound(p, {SO, K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: selective-offload is not allowed")));
  p = SelectiveStack(2, 1.0, 600);
  p.allow_offload = false;
  EXPECT_THAT(EvaluateJoint(p, {K, SO}).status().message(),
              HasSubstr("unit 1: selective-offload but offload not allowed"));
  p = SelectiveStack(2, 1.0, 600);
  p.units[1].selective = false;
  EXPECT_THAT(EvaluateJoint(p, {K, SO}).status().message(),
              HasSubstr("unit 1: selective but not selective"));
}

TEST(JointPlanTest, MalformedSelectiveUnitsAreRefused) {
  JointProblem p = SelectiveStack(2, 1.0, 600);
  p.units[1].selective_bytes = 0;
  EXPECT_THAT(PlanJoint(p), StatusIs(StatusCode::kInvalidArgument,
                                     HasSubstr("unit 1: selective_bytes 0")));
  p.units[1].selective_bytes = 301;
  EXPECT_THAT(ValidateJointProblem(p).message(),
              HasSubstr("unit 1: selective_bytes 301 must be positive and "
                        "within saved_bytes 300"));
  p = SelectiveStack(2, 1.0, 600);
  p.units[0].selective_ns = -1;
  EXPECT_THAT(SmallestJointBudget(p),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: selective_ns must be finite")));
  p = SelectiveStack(2, 1.0, 600);
  p.units[0].recomputable = false;
  EXPECT_THAT(PlanJoint(p).status().message(),
              HasSubstr("unit 0: selective requires recomputable"));
  p.units[0].selective = false;
  EXPECT_THAT(EvaluateJoint(p, {S, K}).status().message(),
              HasSubstr("unit 0: selective but not selective"));
  // Not selective: its selective figures are not looked at.
  p.units[0].selective_bytes = 0;
  EXPECT_OK(PlanJoint(p).status());
  EXPECT_THAT(EvaluateJoint(p, {K, S, K}).status().message(),
              HasSubstr("3 choices for 2 units"));
}

TEST(JointPlanTest, FormatShowsSelective) {
  const JointProblem p = SelectiveStack(3, 0.1, 600);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  const std::string text = FormatJointPlan(plan, p);
  EXPECT_THAT(text, HasSubstr("recompute_ms  selective_ms  choice"));
  EXPECT_THAT(text, HasSubstr("   0          300   0.000   0.000         "
                              "0.000         0.000  selective"));
  EXPECT_THAT(text, HasSubstr("recompute 0.000 ms, selective 0.000 ms)"));
}

// Ten, eleven and 24 units that may be selective (and selective-offload:
// 4^10 assignments, more than PlanJoint tries one by one): the greedy
// search, which tries every kind per unit (and, its first rounds adding
// the roomiest, full re-runs, then turns them selective). It finds plans
// that fit, faster than without selective. Ten and eleven units re-run
// only selectively; of 24, the greedy rounds leave some full re-runs (no
// swap fits).
TEST(JointPlanTest, SelectiveUnitsInBothSearches) {
  for (int units : {10, 11, 24}) {
    JointProblem p = SelectiveStack(units, 0.1, 300 * units / 2);
    ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
    EXPECT_OK(ValidateJointPlan(plan, p));
    EXPECT_LE(plan.peak_bytes, p.budget);
    EXPECT_GT(plan.selective_ns, 0) << units;
    if (units <= 11) {
      EXPECT_DOUBLE_EQ(plan.recompute_ns, 0) << units;
    }
    for (UnitCost& u : p.units) u.selective = false;
    ASSERT_OK_AND_ASSIGN(JointPlan full, PlanJoint(p));
    EXPECT_LT(plan.step_ns, full.step_ns) << units;
  }
}

// With more assignments than PlanJoint tries one by one (11 to 13 units,
// most of them selective: the greedy search), the plan still validates and
// is no slower than nothing re-run, any one unit re-run (either kind), or
// every unit re-run in full or selectively.
RC_GTEST_PROP(JointPlanProperties, TheGreedySearchBeatsTheSimpleAlternatives,
              ()) {
  JointProblem p;
  p.d2h_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
  p.h2d_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
  const int n = *rc::gen::inRange(11, 14);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    UnitCost u = *GenUnitCost();
    u.recomputable = true;
    if (*rc::gen::weightedElement<bool>({{4, true}, {1, false}})) {
      u.selective = true;
      u.selective_bytes = *rc::gen::inRange<int64_t>(1, u.saved_bytes + 1);
      u.selective_ns = *rc::gen::inRange(0, 1000);
    }
    total += u.saved_bytes;
    p.units.push_back(u);
  }
  p.budget = *rc::gen::inRange<int64_t>(total / 4 + 1, total + 1);
  StatusOr<JointPlan> plan = PlanJoint(p);
  const std::vector<std::vector<UnitChoice>> alternatives = SimpleAlternatives(p);
  if (!plan.ok()) {
    RC_ASSERT(plan.status().code() == StatusCode::kResourceExhausted);
    for (const auto& r : alternatives) RC_ASSERT(!EvaluateJoint(p, r).ok());
    return;
  }
  RC_ASSERT(ValidateJointPlan(*plan, p).ok());
  for (const auto& r : alternatives) {
    StatusOr<JointPlan> other = EvaluateJoint(p, r);
    if (other.ok()) RC_ASSERT(plan->step_ns <= other->step_ns);
  }
}

}  // namespace
}  // namespace offload
