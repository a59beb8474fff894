// The joint keep / offload / recompute plan (SPEC §4.8), on cases worked by
// hand in the comments, and its properties over random problems.

#include "engine/plan/joint_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "engine/plan/joint_problem_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(JointPlanTest, EverythingFitsSoEverythingIsKept) {
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(Stack(2, 1.0, 600)));
  EXPECT_THAT(plan.choice, ElementsAre(K, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 600);  // 2 x 100 + 2 x 200
  EXPECT_EQ(plan.peak_bytes, 600);
  EXPECT_EQ(plan.offloaded_bytes, 0);
}

// Fast copies (300 bytes in 30 ns) hide behind compute: unit 0 goes to
// host before unit 2 runs and is back (reloaded while unit 1's backward
// runs) before its own; recomputing would only add time.
TEST(JointPlanTest, CopiesThatHideAreFree) {
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(Stack(3, 10.0, 600)));
  EXPECT_THAT(plan.choice, ElementsAre(O, K, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 900);
  EXPECT_DOUBLE_EQ(plan.stall_ns, 0);
  EXPECT_EQ(plan.peak_bytes, 600);
  EXPECT_EQ(plan.offloaded_bytes, 300);
  // The schedule a caller follows: released for unit 2, reloaded while
  // unit 1's backward runs; the kept units move nowhere.
  EXPECT_THAT(plan.released_during, ElementsAre(2, -1, -1));
  EXPECT_THAT(plan.reloaded_during, ElementsAre(1, -1, -1));
}

// 4 units, budget 630, copies of 300 ns (1 GB/s). A unit's bytes arrive
// evenly over its forward; a released unit's copy runs from its forward's
// start and ends no earlier than its forward.
//  - Offload only: unit 0's copy runs 0..300, unit 1's 300..600. Unit 2
//    needs unit 0 gone after 10% of its forward (210): waits until 300;
//    unit 3 needs unit 1 gone at 400: waits until 600. Forward ends at 690
//    (stalls 290). Backward: unit 3 690..890; unit 1 reloads 890..1190
//    while unit 2 runs 890..1090; unit 0 reloads 1190..1490; unit 1 runs
//    1190..1390, unit 0 1490..1690. Step 1690.
//  - Checkpointing only: two recomputed units leave 660 bytes > 630, so
//    three are: 400 + 800 + 300 = 1500.
//  - Recompute unit 1, offload unit 0: 300 + 30 + 300 fill the budget; unit
//    3 needs unit 0 gone at its start (300), when its copy is done. Forward
//    400; backward: unit 0 comes back 600..900 while unit 2 runs (330 +
//    300 fit), unit 1 runs 800..1100 with its recompute, unit 0
//    1100..1300. Step 1300, no stall.
TEST(JointPlanTest, MixingBeatsBothOffloadingAndCheckpointing) {
  JointProblem p = Stack(4, 1.0, 630);
  ASSERT_OK_AND_ASSIGN(JointPlan joint, PlanJoint(p));
  EXPECT_THAT(joint.choice, ElementsAre(O, R, K, K));
  EXPECT_DOUBLE_EQ(joint.step_ns, 1300);
  EXPECT_DOUBLE_EQ(joint.stall_ns, 0);
  EXPECT_DOUBLE_EQ(joint.recompute_ns, 100);
  EXPECT_EQ(joint.peak_bytes, 630);

  p.allow_recompute = false;
  ASSERT_OK_AND_ASSIGN(JointPlan offload, PlanJoint(p));
  EXPECT_THAT(offload.choice, ElementsAre(O, O, K, K));
  EXPECT_DOUBLE_EQ(offload.step_ns, 1690);
  EXPECT_DOUBLE_EQ(offload.stall_ns, 490);

  p.allow_recompute = true;
  p.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(JointPlan checkpoint, PlanJoint(p));
  EXPECT_THAT(checkpoint.choice, ElementsAre(R, R, R, K));
  EXPECT_DOUBLE_EQ(checkpoint.step_ns, 1500);
  EXPECT_EQ(checkpoint.offloaded_bytes, 0);
}

// Slow copies (300 bytes in 3000 ns): recomputing two units beats any
// offload.
TEST(JointPlanTest, SlowCopiesMakeRecomputeWin) {
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(Stack(3, 0.1, 600)));
  EXPECT_THAT(plan.choice, ElementsAre(R, R, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 300 + 600 + 200);
  // Unit 2 runs next to both inputs: 30 + 30 + 300.
  EXPECT_EQ(plan.peak_bytes, 360);
}

// The re-created bytes count: recomputing unit 3 alone fits the forward
// (300 + 300 + 30 after unit 0 left) but not its backward, where units 1
// and 2 are still on device next to its 300 bytes (900): unit 1 goes to
// host too, at the forward's end.
TEST(JointPlanTest, RecomputedBytesCountInTheBackward) {
  JointProblem p = Stack(4, 1.5, 630);
  ASSERT_OK_AND_ASSIGN(JointPlan plan,
                       EvaluateJoint(p, {false, false, false, true}));
  EXPECT_THAT(plan.choice, ElementsAre(O, O, K, R));
  EXPECT_THAT(plan.released_during, ElementsAre(2, 3, -1, -1));
  EXPECT_LE(plan.peak_bytes, 630);
}

// Budget 700 for three 300-byte units, copies of 30 ns. Without a
// transient unit 0 alone makes room for unit 2 (300 + 300 + 300 > 700,
// then 600). Unit 2's forward holding 350 bytes more for a moment needs
// unit 1 gone too: 300 + 300 + 350 > 700, then 300 + 350 = 650, the peak.
// Backward: unit 2 holds 300; unit 1 comes back while it runs (600), unit
// 0 while unit 1 runs (600). The copies hide: step 900.
TEST(JointPlanTest, AForwardTransientForcesAnotherRelease) {
  JointProblem p = Stack(3, 10.0, 700);
  ASSERT_OK_AND_ASSIGN(JointPlan without,
                       EvaluateJoint(p, {false, false, false}));
  EXPECT_THAT(without.choice, ElementsAre(O, K, K));
  EXPECT_EQ(without.peak_bytes, 600);
  p.units[2].forward_transient_bytes = 350;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(O, O, K));
  EXPECT_EQ(plan.peak_bytes, 650);
  EXPECT_EQ(plan.offloaded_bytes, 600);
  EXPECT_DOUBLE_EQ(plan.step_ns, 900);
  EXPECT_DOUBLE_EQ(plan.stall_ns, 0);
  // Unit 2 alone needs 650: with 649 nothing fits.
  p.budget = 649;
  EXPECT_THAT(EvaluateJoint(p, {false, false, false}).status().message(),
              HasSubstr("too small in the forward: unit 2"));
}

// Two units fill the budget of 600; unit 1's forward holding 200 bytes
// more for a moment sends unit 0 to host (copy 0..300 at 1 B/ns). Unit 1's
// saved and transient bytes arrive evenly: room for 300 of its 500 is
// there, so the forward waits for the copy at 60% of it (160 ns) until
// 300 and ends at 340: a 140 ns stall. Unit 0 comes back while unit 1's
// backward runs (340..640, 300 + 300 fit) and waits 100 more: step 840.
TEST(JointPlanTest, AForwardTransientTakesRoomAsItArrives) {
  JointProblem p = Stack(2, 1.0, 600);
  p.allow_recompute = false;
  p.units[1].forward_transient_bytes = 200;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(O, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 840);
  EXPECT_DOUBLE_EQ(plan.stall_ns, 240);
  EXPECT_EQ(plan.peak_bytes, 600);
}

// Checkpointing two units at 600 bytes, each forward holding a transient
// (unit 0: 300, unit 1: 200); unit 1 re-creates only 100 bytes and
// re-runs in 50 ns, unit 0 re-creates 270 in 100 ns. Keeping both: unit
// 1's forward needs 800. Recomputing unit 1 next to the kept unit 0 fits
// the forward (300 + 30 + 200) and, without the re-run's transient, its
// backward (330 + 100), and would be 50 ns faster; but the re-run holds
// its 200 bytes too: 630 > 600. Recomputing unit 0 (checkpointing's
// choice) fits: forward 330 then 530; backward 330, then unit 0's re-run
// with 30 + 270 + 300 = 600, the peak. Step 600 + 100.
TEST(JointPlanTest, ARerunsTransientCountsInTheBackward) {
  JointProblem p = Stack(2, 1.0, 600);
  p.allow_offload = false;
  p.units[0].forward_transient_bytes = 300;
  p.units[1].forward_transient_bytes = 200;
  p.units[1].recompute_bytes = 100;
  p.units[1].recompute_ns = 50;
  StatusOr<JointPlan> last = EvaluateJoint(p, {false, true});
  ASSERT_EQ(last.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(last.status().message(), HasSubstr("while unit 1 runs, 630"));
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(R, K));
  EXPECT_EQ(plan.peak_bytes, 600);
  EXPECT_DOUBLE_EQ(plan.step_ns, 700);
  EXPECT_DOUBLE_EQ(plan.recompute_ns, 100);
}

// Two units kept at 600 bytes: unit 1's backward holding 50 bytes of
// temporaries needs 650.
// With offloading, unit 0 goes to host at the forward's end for it.
TEST(JointPlanTest, ABackwardTransientCountsInTheBackward) {
  JointProblem p = Stack(2, 1.0, 600);
  p.allow_recompute = false;
  p.allow_offload = false;
  ASSERT_OK(EvaluateJoint(p, {false, false}).status());
  p.units[1].backward_transient_bytes = 50;
  StatusOr<JointPlan> plan = EvaluateJoint(p, {false, false});
  ASSERT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("in the backward: while unit 1 runs, 650 bytes"));
  p.allow_offload = true;
  ASSERT_OK_AND_ASSIGN(JointPlan offloads, EvaluateJoint(p, {false, false}));
  EXPECT_THAT(offloads.choice, ElementsAre(O, K));
  EXPECT_EQ(offloads.peak_bytes, 600);
  p.budget = 650;
  p.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(JointPlan fits, EvaluateJoint(p, {false, false}));
  EXPECT_EQ(fits.peak_bytes, 650);
}

// Budget 650, copies of 30 ns: unit 0 goes to host for unit 2 and, as in
// CopiesThatHideAreFree, comes back while unit 1's backward runs (300 +
// 300). With 340 bytes of temporaries in unit 1's backward (its peak 640)
// it no longer fits there and comes back at its own backward, 700..730: a
// 30 ns stall, step 930, peak 640. Recomputing instead fits nowhere: a
// re-run beside unit 1's peak or unit 2's bytes exceeds 650.
TEST(JointPlanTest, ABackwardTransientDelaysAReload) {
  JointProblem p = Stack(3, 10.0, 650);
  ASSERT_OK_AND_ASSIGN(JointPlan early, PlanJoint(p));
  EXPECT_THAT(early.choice, ElementsAre(O, K, K));
  EXPECT_DOUBLE_EQ(early.step_ns, 900);
  EXPECT_EQ(early.peak_bytes, 600);
  EXPECT_THAT(early.reloaded_during, ElementsAre(1, -1, -1));
  p.units[1].backward_transient_bytes = 340;
  ASSERT_OK_AND_ASSIGN(JointPlan late, PlanJoint(p));
  EXPECT_THAT(late.choice, ElementsAre(O, K, K));
  EXPECT_DOUBLE_EQ(late.step_ns, 930);
  EXPECT_DOUBLE_EQ(late.stall_ns, 30);
  EXPECT_EQ(late.peak_bytes, 640);
  EXPECT_THAT(late.reloaded_during, ElementsAre(0, -1, -1));  // its own
}

TEST(JointPlanTest, NoPlanFitsIsAClearError) {
  JointProblem p = Stack(3, 1.0, 200);
  p.units[1].recomputable = false;
  StatusOr<JointPlan> plan = PlanJoint(p);
  ASSERT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("unit 1"));
  EXPECT_THAT(plan.status().message(), HasSubstr("budget of 200 bytes"));
}

// A head (a last unit with no backward time) holds its bytes at the
// forward's end only: the earlier units make room for it, and its bytes are
// gone when their backward runs. A unit that may not be offloaded stays.
TEST(JointPlanTest, AUnitThatMayNotBeOffloadedStays) {
  JointProblem p = Stack(3, 10.0, 700);
  for (UnitCost& u : p.units) u.recomputable = false;
  UnitCost head;
  head.saved_bytes = 400;
  head.forward_ns = 50;
  head.offloadable = false;
  p.units.push_back(head);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  // 300 x 3 + 400 > 700: units 0 and 1 go to host, earliest first.
  EXPECT_THAT(plan.choice, ElementsAre(O, O, K, K));
  EXPECT_EQ(plan.peak_bytes, 700);
  // Unit 0 may not go: units 1 and 2 go instead.
  p.units[0].offloadable = false;
  ASSERT_OK_AND_ASSIGN(plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(K, O, O, K));
  // Less than unit 0 and the head: no plan fits.
  p.budget = 699;
  EXPECT_EQ(PlanJoint(p).status().code(), StatusCode::kResourceExhausted);
}

// Equal steps and counts: the plan with the lower peak wins. Recomputing
// units 0 and 1 (found first) holds unit 2's 300 bytes beside the others at
// the forward's end (340); recomputing 1 and 2 keeps the small unit 0
// instead (peak 260, while unit 2's recompute runs).
TEST(JointPlanTest, TiesGoToTheLowerPeak) {
  JointProblem p = Stack(3, 1.0, 420);
  p.allow_offload = false;
  p.units[0].saved_bytes = 100;
  p.units[0].input_bytes = 10;
  for (UnitCost& u : p.units) u.recompute_bytes = std::min<int64_t>(100, u.saved_bytes);
  p.units[0].recompute_bytes = 50;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(K, R, R));
  EXPECT_EQ(plan.peak_bytes, 260);
}

// The smallest budget fits and one byte less does not; it ignores the
// problem's own budget.
TEST(JointPlanTest, SmallestBudgetIsTheEdgeOfFeasibility) {
  for (double gbps : {0.5, 1.0, 10.0}) {
    JointProblem p = Stack(4, gbps, 1);
    p.units[1].recomputable = false;
    ASSERT_OK_AND_ASSIGN(int64_t smallest, SmallestJointBudget(p));
    p.budget = smallest;
    EXPECT_OK(PlanJoint(p).status()) << gbps;
    p.budget = smallest - 1;
    EXPECT_EQ(PlanJoint(p).status().code(), StatusCode::kResourceExhausted)
        << gbps;
  }
  JointProblem bad = Stack(2, 1.0, 600);
  bad.units[0].saved_bytes = 0;
  EXPECT_EQ(SmallestJointBudget(bad).status().code(),
            StatusCode::kInvalidArgument);
}

// Two units of 100 bytes; unit 1's backward holds 99 more. At 199, unit
// 1's forward sends unit 0 to host. From 200 on the forward could keep unit
// 0, but unit 1's backward would then need 299: unit 0 goes to host at the
// forward's end instead, and comes back for its own backward. So every
// budget from 199 on fits (before, 200..298 fit no plan, and a larger
// budget was refused where a smaller one was planned).
TEST(JointPlanTest, TheBackwardsPeakSendsAUnitTheForwardKeptToHost) {
  JointProblem p;
  for (int i = 0; i < 2; ++i) {
    UnitCost u;
    u.saved_bytes = 100;
    u.forward_ns = 100;
    u.backward_ns = 200;
    p.units.push_back(u);
  }
  p.units[1].backward_transient_bytes = 99;
  p.d2h_gbps = p.h2d_gbps = 1.0;
  p.budget = 198;
  EXPECT_EQ(PlanJoint(p).status().code(), StatusCode::kResourceExhausted);
  for (int64_t budget : {199, 200, 250, 298, 299}) {
    p.budget = budget;
    EXPECT_OK(PlanJoint(p).status()) << budget;
  }
  p.budget = 200;
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(O, K));
  EXPECT_THAT(plan.released_during, ElementsAre(1, -1));  // at unit 1's end
  EXPECT_THAT(plan.reloaded_during, ElementsAre(0, -1));  // for its own
  EXPECT_EQ(plan.peak_bytes, 200);
  // The copy (100 ns from 0) is done when the forward ends (200 ns); it
  // comes back during unit 0's backward slot, 100 ns at 400..500.
  EXPECT_DOUBLE_EQ(plan.stall_ns, 100);
  EXPECT_THAT(SmallestJointBudget(p), IsOkAndHolds(199));
  p.allow_offload = false;
  EXPECT_THAT(SmallestJointBudget(p), IsOkAndHolds(299));
}

TEST(JointPlanTest, MalformedProblemsAndChoicesAreRefused) {
  JointProblem p = Stack(2, 1.0, 600);
  p.units[1].input_bytes = 400;
  EXPECT_THAT(PlanJoint(p).status().message(), HasSubstr("unit 1: input_bytes"));
  p = Stack(2, 0.0, 600);
  EXPECT_EQ(PlanJoint(p).status().code(), StatusCode::kInvalidArgument);
  p.allow_offload = false;  // no bandwidth needed then
  EXPECT_OK(PlanJoint(p).status());
  p = Stack(2, 1.0, 600);
  p.units[0].recomputable = false;
  EXPECT_THAT(EvaluateJoint(p, {true, false}).status().message(),
              HasSubstr("unit 0: recomputed but not recomputable"));
  EXPECT_EQ(EvaluateJoint(p, std::vector<bool>{true}).status().code(),
            StatusCode::kInvalidArgument);
  p.units[0].backward_ns = -1;
  EXPECT_THAT(PlanJoint(p).status().message(), HasSubstr("unit 0: times"));
  p = Stack(2, 1.0, 600);
  p.units[1].forward_transient_bytes = -1;
  EXPECT_THAT(PlanJoint(p),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 1: forward_transient_bytes must not "
                                 "be negative, got -1")));
  p.units[1].forward_transient_bytes = 0;
  p.units[0].backward_transient_bytes = -5;
  EXPECT_THAT(SmallestJointBudget(p),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: backward_transient_bytes")));
}

TEST(JointPlanTest, ValidationCatchesAPlanThatIsNotTheModels) {
  const JointProblem p = Stack(4, 1.5, 630);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_OK(ValidateJointPlan(plan, p));
  JointPlan wrong = plan;
  wrong.choice[2] = UnitChoice::kOffload;  // the budget does not need it
  EXPECT_THAT(ValidateJointPlan(wrong, p).message(),
              HasSubstr("unit 2: offload, but the budget makes it keep"));
  wrong = plan;
  wrong.step_ns -= 1;
  EXPECT_THAT(ValidateJointPlan(wrong, p).message(), HasSubstr("figures"));
  wrong.choice = {O, K, K, R};  // unit 1 goes to host too (test above)
  EXPECT_THAT(ValidateJointPlan(wrong, p).message(),
              HasSubstr("unit 1: keep, but the budget makes it offload"));
  JointProblem kept = p;
  kept.allow_offload = false;
  wrong.choice = {K, K, K, R};  // does not fit without offloading
  EXPECT_THAT(ValidateJointPlan(wrong, kept).message(), HasSubstr("does not fit"));
}

TEST(JointPlanTest, FormatShowsEveryUnitAndTheTotals) {
  const JointProblem p = Stack(4, 1.0, 630);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  const std::string text = FormatJointPlan(plan, p);
  EXPECT_THAT(text, HasSubstr("   1          300   0.000   0.000         0.000  recompute"));
  EXPECT_THAT(text, HasSubstr("predicted step 0.001 ms"));
  EXPECT_THAT(text, HasSubstr("peak 630 bytes, budget 630"));
}

// More units than the exhaustive search takes: the greedy search still
// finds a plan that fits, faster than offloading alone (whose copies do not
// hide) and than checkpointing alone.
TEST(JointPlanTest, ManyUnitsUseTheGreedySearch) {
  JointProblem p = Stack(24, 1.0, 300 * 12);
  ASSERT_OK_AND_ASSIGN(JointPlan joint, PlanJoint(p));
  EXPECT_OK(ValidateJointPlan(joint, p));
  EXPECT_LE(joint.peak_bytes, p.budget);
  p.allow_recompute = false;
  ASSERT_OK_AND_ASSIGN(JointPlan offload, PlanJoint(p));
  p.allow_recompute = true;
  p.allow_offload = false;
  ASSERT_OK_AND_ASSIGN(JointPlan checkpoint, PlanJoint(p));
  std::printf("24 units: joint %.0f ns, offload %.0f ns, checkpoint %.0f ns\n",
              joint.step_ns, offload.step_ns, checkpoint.step_ns);
  EXPECT_LT(joint.step_ns, offload.step_ns);
  EXPECT_LT(joint.step_ns, checkpoint.step_ns);
}

// Up to `most_units` units of up to `most_bytes` each; a budget up to all
// their saved bytes and the largest transient.
rc::Gen<JointProblem> GenProblem(int most_units = 7,
                                 int64_t most_bytes = 1000) {
  return rc::gen::exec([=] {
    JointProblem p;
    const int n = *rc::gen::inRange(1, most_units + 1);
    int64_t total = 0, transient = 0;
    for (int i = 0; i < n; ++i) {
      const UnitCost u = *GenUnitCost(most_bytes);
      total += u.saved_bytes;
      transient = std::max({transient, u.forward_transient_bytes,
                            u.backward_transient_bytes});
      p.units.push_back(u);
    }
    p.d2h_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
    p.h2d_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
    p.budget = *rc::gen::inRange<int64_t>(1, total + transient + 1);
    return p;
  });
}

// The plan is the model's best: it validates, never exceeds the budget, and
// is no slower than any single alternative (all kept, offload only, every
// recomputable unit recomputed, each one alone).
RC_GTEST_PROP(JointPlanProperties, BestAmongAlternativesAndWithinBudget, ()) {
  JointProblem p = *GenProblem();
  p.allow_recompute = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
  StatusOr<JointPlan> plan = PlanJoint(p);
  const int n = static_cast<int>(p.units.size());
  const std::vector<std::vector<UnitChoice>> alternatives = SimpleAlternatives(p);
  if (!plan.ok()) {
    RC_ASSERT(plan.status().code() == StatusCode::kResourceExhausted);
    for (const auto& r : alternatives) RC_ASSERT(!EvaluateJoint(p, r).ok());
    return;
  }
  RC_ASSERT(ValidateJointPlan(*plan, p).ok());
  RC_ASSERT(plan->peak_bytes <= p.budget);
  for (int i = 0; i < n; ++i) {
    if (plan->Selective(i)) RC_ASSERT(p.units[i].selective && p.allow_recompute);
  }
  for (const auto& r : alternatives) {
    StatusOr<JointPlan> other = EvaluateJoint(p, r);
    if (other.ok()) RC_ASSERT(plan->step_ns <= other->step_ns);
  }
  // Re-runs never make the step faster than the work itself, and their
  // times add up.
  double work = 0, recompute = 0, selective = 0;
  for (int i = 0; i < n; ++i) {
    const UnitCost& u = p.units[i];
    work += u.forward_ns + u.backward_ns;
    if (plan->Recompute(i)) recompute += u.recompute_ns;
    if (plan->Selective(i)) selective += u.selective_ns;
  }
  RC_ASSERT(plan->step_ns >= work + recompute + selective);
  RC_ASSERT(plan->recompute_ns == recompute);
  RC_ASSERT(plan->selective_ns == selective);
}

// The smallest budget is the least at which PlanJoint succeeds, checked
// against every budget below it (small units, so that is quick), and so
// also below any gap where larger budgets fail.
RC_GTEST_PROP(JointPlanProperties, SmallestBudgetIsTheLeastThatFits, ()) {
  JointProblem p = *GenProblem(5, 40);
  p.allow_offload = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  p.allow_recompute = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  StatusOr<int64_t> smallest = SmallestJointBudget(p);
  RC_ASSERT(smallest.ok());
  p.budget = *smallest;
  RC_ASSERT(PlanJoint(p).ok());
  for (p.budget = 1; p.budget < *smallest; ++p.budget) {
    RC_ASSERT(PlanJoint(p).status().code() == StatusCode::kResourceExhausted);
  }
}

// A plan that fits a budget leaves one for every larger budget: a budget
// is never refused where a smaller one is planned.
RC_GTEST_PROP(JointPlanProperties, WhatFitsABudgetFitsALargerOne, ()) {
  JointProblem p = *GenProblem(5, 40);
  p.allow_offload = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  p.allow_recompute = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  StatusOr<int64_t> smallest = SmallestJointBudget(p);
  RC_ASSERT(smallest.ok());
  int64_t top = 0;
  for (const UnitCost& u : p.units) {
    top += u.saved_bytes + u.forward_transient_bytes + u.backward_transient_bytes;
  }
  for (p.budget = *smallest; p.budget <= top; ++p.budget) {
    RC_ASSERT(PlanJoint(p).ok());
  }
}

}  // namespace
}  // namespace offload
