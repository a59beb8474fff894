// The limit of the joint plan (engine/plan/joint_limit.h): cases worked by hand
// in the comments, and its properties over random small problems against
// PlanJoint (never above its predicted step), against every single choice
// (the least bound, searched exactly) and against the budget.

#include "engine/plan/joint_limit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {

// For gtest's messages: "keep", "offload", "recompute".
void PrintTo(UnitChoice c, std::ostream* os) { *os << UnitChoiceName(c); }

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// a <= b, up to the rounding of two different sums of the same terms.
bool AtMost(double a, double b) {
  return a <= b + 1e-9 * std::max(1.0, std::fabs(b));
}

bool Allowed(const JointProblem& p, int unit, UnitChoice c) {
  const UnitCost& u = p.units[unit];
  if (c == O) return p.allow_offload && u.offloadable;
  if (c == R) return p.allow_recompute && u.recomputable;
  if (c == S) return p.allow_recompute && u.recomputable && u.selective;
  if (c == UnitChoice::kSelectiveOffload) {
    return p.allow_recompute && p.allow_offload && u.recomputable &&
           u.selective && u.offloadable;
  }
  return true;
}

// Forward + backward + the recomputed and selective units' re-runs.
double Compute(const JointProblem& p, const std::vector<UnitChoice>& c) {
  double total = 0;
  for (size_t i = 0; i < p.units.size(); ++i) {
    total += p.units[i].forward_ns + p.units[i].backward_ns +
             (c[i] == R ? p.units[i].recompute_ns
              : c[i] == S || c[i] == UnitChoice::kSelectiveOffload
                  ? p.units[i].selective_ns
                  : 0.0);
  }
  return total;
}

// Everything fits: nothing moves and the limit is the compute.
TEST(JointLimitTest, EverythingFitsSoEverythingIsKept) {
  for (int64_t budget : {900, 5000}) {
    ASSERT_OK_AND_ASSIGN(JointLimitResult limit,
                         JointLimit(Stack(3, 1.0, budget)));
    EXPECT_THAT(limit.choice, ElementsAre(K, K, K));
    EXPECT_DOUBLE_EQ(limit.step_ns, 900);  // 3 x (100 + 200)
    EXPECT_DOUBLE_EQ(limit.compute_ns, 900);
  }
}

// Budget 600 for three 300-byte units: one must leave. At 1000 B/ns its
// 300 bytes move in 0.3 ns, and where they move decides whether that hides:
//  - Unit 0: out by unit 2's end (300 ns), back during unit 1's backward
//    (room 300 then): no stall. Step 900.
//  - Unit 1: units 0 and 2 fill the budget during unit 2's backward, so
//    unit 1 comes back after it: S_1 >= E_2 + 0.3. Step 900.3.
//  - Unit 2: units 0 and 1 are kept while unit 2's backward needs its own
//    300 bytes too: 900 bytes, no schedule fits.
TEST(JointLimitTest, FastCopiesMakeOneOffloadFree) {
  const JointProblem p = Stack(3, 1000.0, 600);
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(O, K, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 900);
  EXPECT_DOUBLE_EQ(limit.compute_ns, 900);
  EXPECT_THAT(JointChoiceBound(p, {O, K, K}), IsOkAndHolds(900.0));
  ASSERT_OK_AND_ASSIGN(double middle, JointChoiceBound(p, {K, O, K}));
  EXPECT_NEAR(middle, 900.3, 1e-9);
  StatusOr<double> last = JointChoiceBound(p, {K, K, O});
  EXPECT_THAT(last, StatusIs(StatusCode::kResourceExhausted,
                             HasSubstr("during unit 2's backward, 900 bytes")));
}

// Two units, budget 300, 1 B/ns, offload only. Keeping unit 0 cannot fit
// (its 300 bytes next to unit 1's in unit 1's backward). Offloading unit 0:
//  - Forward: by unit 1's end, 300 bytes must be out, and none existed
//    before 0 ns: F_1 >= 300 (compute alone: 200), a 100 ns stall.
//  - Backward: unit 1 (200 ns) holds the whole budget, so unit 0's 300
//    bytes come back after it: 500 + 300, then unit 0's 200 ns. Step 1000.
// A schedule reaches it, so the bound is not too strong here: unit 0's copy
// runs at 1 B/ns from 0 ns, unit 1's forward advances (stalling in small
// steps) only as fast as that copy frees room, ending at 300; its backward
// runs 300..500, unit 0 comes back 500..800 and runs 800..1000.
// PlanJoint's schedule is slower, 1100: it releases unit 0 before unit 1
// starts (copy 0..300, forward ends 400), where the bound checks memory
// only at unit 1's end and lets the copy overlap unit 1's forward.
TEST(JointLimitTest, StallsWorkedByHand) {
  JointProblem p = Stack(2, 1.0, 300);
  p.allow_recompute = false;
  EXPECT_THAT(JointChoiceBound(p, {O, K}), IsOkAndHolds(1000.0));
  EXPECT_THAT(JointChoiceBound(p, {K, O}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 1's backward, 600 bytes")));
  EXPECT_THAT(JointChoiceBound(p, {K, K}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("at the end of unit 1's forward, 600 bytes")));
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(O, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 1000);
  EXPECT_DOUBLE_EQ(limit.compute_ns, 600);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_DOUBLE_EQ(plan.step_ns, 1100);
}

// One unit offloaded though it fits (budget 300), at 1 B/ns: its 300 bytes
// arrive over 0..100, so the copy out at 1 B/ns ends at 300 at the
// earliest. Each byte may come back as soon as it left (copy back 0..300
// right behind the copy out), so the backward runs 300..500: step 500,
// and that schedule reaches it. Out and then back would give 800.
TEST(JointLimitTest, OutAndBackMayOverlap) {
  const JointProblem p = Stack(1, 1.0, 300);
  EXPECT_THAT(JointChoiceBound(p, {O}), IsOkAndHolds(500.0));
  EXPECT_THAT(JointChoiceBound(p, {K}), IsOkAndHolds(300.0));
}

// Budget 600, 0.5 B/ns, offload only; unit 1's backward holds 250 bytes
// of temporaries, so both kept need 850 there. Offloading unit 0 fits the
// forward (600 at F_1 = 200) and leaves room 50 in unit 1's backward: 250
// of unit 0's bytes must be off device by E_1, and none existed before
// 0 ns: E_1 >= 250 / 0.5 = 500 (compute alone: 400). They come back after
// E_1: S_0 >= 500 + 250 / 0.5 = 1000; step 1200. Before session 27 the
// bound took them as gone at E_1 = 400, however slow the copy: 1100.
TEST(JointLimitTest, TheBackwardsPeakWaitsForTheCopyOut) {
  JointProblem p = Stack(2, 0.5, 600);
  p.allow_recompute = false;
  p.units[1].backward_transient_bytes = 250;
  EXPECT_THAT(JointChoiceBound(p, {O, K}), IsOkAndHolds(1200.0));
  EXPECT_THAT(JointChoiceBound(p, {K, K}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 1's backward, 850 bytes")));
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(O, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 1200);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_GE(plan.step_ns, limit.step_ns);
}

// At 0.1 B/ns one unit's copy alone takes 3000 ns, more than the whole
// compute: recomputing is cheaper. One recomputed unit leaves 630 bytes in
// the forward; of the pairs only units 0 and 1 fit the backward (units
// 1 and 2: unit 2's backward holds 300 + 30 + 30 + 270 = 630). Step
// 900 + 2 x 100, which PlanJoint also finds.
TEST(JointLimitTest, SlowCopiesMakeRecomputeWin) {
  const JointProblem p = Stack(3, 0.1, 600);
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(R, R, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 1100);
  EXPECT_DOUBLE_EQ(limit.compute_ns, 1100);
  EXPECT_THAT(JointChoiceBound(p, {K, R, R}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 2's backward, 630 bytes")));
  ASSERT_OK_AND_ASSIGN(double offload, JointChoiceBound(p, {O, K, K}));
  EXPECT_GE(offload, 3000 + 200);  // out and back before unit 0's backward
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_DOUBLE_EQ(plan.step_ns, limit.step_ns);
}

// Transients count at the boundaries as PlanJoint counts them.
//  - Two kept units at 600 bytes: unit 1's forward holding 250 bytes more
//    needs 850; offloading unit 0, 250 of its bytes must be out by unit
//    1's end, none before 0 ns: F_1 >= 250 at 1 B/ns (compute: 200). The
//    backward then has room for unit 0 next to unit 1's: step 250 + 400.
//    Offloading unit 1 instead: 250 of its bytes out, none before 100 ns:
//    F_1 >= 350, and it is back by 400 at the earliest: 800.
//  - Unit 1's backward holding 50 bytes of temporaries: 650 with both kept.
//  - PlanJoint's ARerunsTransientCountsInTheBackward: recomputing unit 1
//    beside the kept unit 0 holds 300 + 30 + 100 + 200 in its backward;
//    recomputing unit 0 is the limit, and PlanJoint's plan.
TEST(JointLimitTest, TransientsCountAtTheBoundaries) {
  JointProblem p = Stack(2, 1.0, 600);
  p.allow_recompute = false;
  EXPECT_THAT(JointChoiceBound(p, {K, K}), IsOkAndHolds(600.0));
  p.units[1].forward_transient_bytes = 250;
  EXPECT_THAT(JointChoiceBound(p, {K, K}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("at the end of unit 1's forward, 850 bytes")));
  EXPECT_THAT(JointChoiceBound(p, {O, K}), IsOkAndHolds(650.0));
  EXPECT_THAT(JointChoiceBound(p, {K, O}), IsOkAndHolds(800.0));
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(O, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 650);

  p = Stack(2, 1.0, 600);
  p.units[1].backward_transient_bytes = 50;
  EXPECT_THAT(JointChoiceBound(p, {K, K}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 1's backward, 650 bytes")));

  p = Stack(2, 1.0, 600);
  p.allow_offload = false;
  p.units[0].forward_transient_bytes = 300;
  p.units[1].forward_transient_bytes = 200;
  p.units[1].recompute_bytes = 100;
  p.units[1].recompute_ns = 50;
  EXPECT_THAT(JointChoiceBound(p, {K, R}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 1's backward, 630 bytes")));
  ASSERT_OK_AND_ASSIGN(limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(R, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 700);
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_THAT(plan.choice, ElementsAre(R, K));
  EXPECT_DOUBLE_EQ(plan.step_ns, 700);
}

// Unit 1 cannot be recomputed and its backward needs 300 bytes whole.
// A unit that may not be offloaded is never offloaded in the limit's
// choice either: a budget that only its offload would meet has no choice.
TEST(JointLimitTest, AUnitThatMayNotBeOffloadedStays) {
  JointProblem p = Stack(2, 1000.0, 300);
  for (UnitCost& u : p.units) u.recomputable = false;
  ASSERT_OK(JointLimit(p).status());  // one of the two goes to host
  p.units[0].offloadable = false;
  StatusOr<JointLimitResult> one = JointLimit(p);
  if (one.ok()) {
    EXPECT_EQ(one->choice[0], UnitChoice::kKeep);
  }
  p.units[1].offloadable = false;
  EXPECT_EQ(JointLimit(p).status().code(), StatusCode::kResourceExhausted);
}

TEST(JointLimitTest, NoChoiceFitsIsAClearError) {
  JointProblem p = Stack(3, 1.0, 200);
  p.units[1].recomputable = false;
  EXPECT_THAT(JointLimit(p),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("fits the budget of 200 bytes")));
  p.allow_offload = false;
  EXPECT_THAT(JointLimit(p), StatusIs(StatusCode::kResourceExhausted,
                                      HasSubstr("no keep/recompute choice")));
}

TEST(JointLimitTest, MalformedProblemsAndChoicesAreRefused) {
  JointProblem p = Stack(2, 1.0, 600);
  p.units[1].input_bytes = 400;
  EXPECT_THAT(JointLimit(p), StatusIs(StatusCode::kInvalidArgument,
                                      HasSubstr("unit 1: input_bytes")));
  EXPECT_THAT(JointLimit(Stack(kJointLimitMaxUnits + 1, 1.0, 600)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("15 units")));
  p = Stack(2, 1.0, 600);
  EXPECT_THAT(JointChoiceBound(p, {K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("1 choices for 2 units")));
  p.units[0].recomputable = false;
  EXPECT_THAT(JointChoiceBound(p, {R, K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: recompute is not allowed")));
  p.allow_offload = false;
  EXPECT_THAT(JointChoiceBound(p, {K, O}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 1: offload is not allowed")));
}

// PlanJoint's PicksSelectiveWhereItsReRunIsCheap: selective units 0 and 1
// (60 bytes kept, 10 ns re-runs) are also the limit: one re-run unit
// leaves 660 bytes at unit 2's end, and copies at 0.1 B/ns take 3000 ns.
// Their bound is the compute, 900 + 20; recomputing them in full, 1100.
// Selective units 1 and 2 beside kept unit 0: 420 at unit 2's end, but
// 300 + 60 + 60 + 240 re-created = 660 in unit 2's backward.
TEST(JointLimitTest, SelectiveUnitsWorkedByHand) {
  JointProblem p = SelectiveStack(3, 0.1, 600);
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ElementsAre(S, S, K));
  EXPECT_DOUBLE_EQ(limit.step_ns, 920);
  EXPECT_DOUBLE_EQ(limit.compute_ns, 920);
  EXPECT_THAT(JointChoiceBound(p, {R, R, K}), IsOkAndHolds(1100.0));
  EXPECT_THAT(JointChoiceBound(p, {K, S, S}),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("during unit 2's backward, 660 bytes")));
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_DOUBLE_EQ(plan.step_ns, limit.step_ns);
  // Not selective, or recompute not allowed: never chosen, and refused.
  p.units[0].selective = false;
  EXPECT_THAT(JointChoiceBound(p, {S, K, K}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unit 0: selective is not allowed")));
  p = SelectiveStack(3, 0.1, 600);
  p.allow_recompute = false;
  ASSERT_OK_AND_ASSIGN(limit, JointLimit(p));
  EXPECT_THAT(limit.choice, ::testing::Not(::testing::Contains(S)));
}

// Five choices per selective unit that may be offloaded: 10 of them are
// more than the search takes (5^10 > 3^14), 9 are not; without offloading,
// three (keep, recompute, selective): 12 are not.
TEST(JointLimitTest, TooManyChoicesAreRefused) {
  EXPECT_THAT(JointLimit(SelectiveStack(10, 1.0, 300 * 6)),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("9765625 choices of the 10 units")));
  EXPECT_OK(JointLimit(SelectiveStack(9, 1.0, 300 * 6)).status());
  JointProblem twelve = SelectiveStack(12, 1.0, 300 * 6);
  twelve.allow_offload = false;
  EXPECT_OK(JointLimit(twelve).status());
}

// The most units the search takes, with a budget that forces a mix: it
// finishes, is never above PlanJoint and not below the compute.
TEST(JointLimitTest, TheLargestProblemIsSearched) {
  const JointProblem p = Stack(kJointLimitMaxUnits, 1.0, 300 * 7);
  ASSERT_OK_AND_ASSIGN(JointLimitResult limit, JointLimit(p));
  ASSERT_OK_AND_ASSIGN(JointPlan plan, PlanJoint(p));
  EXPECT_TRUE(AtMost(limit.step_ns, plan.step_ns))
      << limit.step_ns << " vs " << plan.step_ns;
  EXPECT_GE(limit.step_ns, limit.compute_ns);
  EXPECT_THAT(JointChoiceBound(p, limit.choice), IsOkAndHolds(limit.step_ns));
}

rc::Gen<JointProblem> GenProblem() {
  return rc::gen::exec([] {
    JointProblem p;
    const int n = *rc::gen::inRange(1, 7);
    int64_t total = 0, largest = 0, transient = 0;
    for (int i = 0; i < n; ++i) {
      const UnitCost u = *GenUnitCost();
      total += u.saved_bytes;
      largest = std::max(largest, u.saved_bytes);
      transient = std::max({transient, u.forward_transient_bytes,
                            u.backward_transient_bytes});
      p.units.push_back(u);
    }
    p.d2h_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
    p.h2d_gbps = *rc::gen::element(0.01, 0.1, 1.0, 10.0);
    // Mostly at least the largest unit, below which few choices fit.
    const bool roomy = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
    p.budget =
        *rc::gen::inRange<int64_t>(roomy ? largest : 1, total + transient + 1);
    p.allow_offload = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
    p.allow_recompute = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
    return p;
  });
}

// PlanJoint's prediction is a schedule of its choice, so neither the limit
// nor the bound of that choice may be above it; and stalls are never
// negative: the limit is at least the compute of its own choice.
RC_GTEST_PROP(JointLimitProperties, NeverAbovePlanJointNorBelowItsCompute, ()) {
  const JointProblem p = *GenProblem();
  StatusOr<JointLimitResult> limit = JointLimit(p);
  StatusOr<JointPlan> plan = PlanJoint(p);
  if (!limit.ok()) {
    RC_ASSERT(limit.status().code() == StatusCode::kResourceExhausted);
    RC_ASSERT(!plan.ok());
    return;
  }
  RC_ASSERT(limit->choice.size() == p.units.size());
  RC_ASSERT(std::fabs(limit->compute_ns - Compute(p, limit->choice)) <= 1e-6);
  RC_ASSERT(limit->step_ns >= limit->compute_ns);
  if (plan.ok()) {
    RC_ASSERT(AtMost(limit->step_ns, plan->step_ns));
    StatusOr<double> bound = JointChoiceBound(p, plan->choice);
    RC_ASSERT(bound.ok());
    RC_ASSERT(AtMost(*bound, plan->step_ns));
  }
}

// The search is exact: the limit is the least bound over every allowed
// choice (enumerated here without pruning), attained by its choice.
RC_GTEST_PROP(JointLimitProperties, IsTheLeastBoundOfAnyChoice, ()) {
  const JointProblem p = *GenProblem();
  const int n = static_cast<int>(p.units.size());
  // Every choice of each unit: keep, offload, recompute, selective and
  // selective-offload (5^6 at most).
  constexpr int kChoices = 5;
  int total = 1;
  for (int i = 0; i < n; ++i) total *= kChoices;
  bool any = false;
  double least = 0;
  for (int code = 0; code < total; ++code) {
    std::vector<UnitChoice> c(n);
    bool allowed = true;
    for (int i = 0, rest = code; i < n; ++i, rest /= kChoices) {
      c[i] = static_cast<UnitChoice>(rest % kChoices);
      allowed = allowed && Allowed(p, i, c[i]);
    }
    if (!allowed) continue;
    StatusOr<double> bound = JointChoiceBound(p, c);
    if (!bound.ok()) {
      RC_ASSERT(bound.status().code() == StatusCode::kResourceExhausted);
      continue;
    }
    RC_ASSERT(*bound >= Compute(p, c));
    if (!any || *bound < least) least = *bound;
    any = true;
  }
  StatusOr<JointLimitResult> limit = JointLimit(p);
  RC_ASSERT(limit.ok() == any);
  if (!any) return;
  RC_ASSERT(AtMost(limit->step_ns, least) && AtMost(least, limit->step_ns));
  StatusOr<double> own = JointChoiceBound(p, limit->choice);
  RC_ASSERT(own.ok());
  RC_ASSERT(*own == limit->step_ns);
}

// Checked here from the definition, not through the bound: at each
// forward's end what cannot leave (kept bytes, recomputed inputs) fits with
// that forward's transient, and during each backward what it needs whole
// at its peak next to what stays fits.
RC_GTEST_PROP(JointLimitProperties, ItsChoiceFitsAtEveryUnitBoundary, ()) {
  const JointProblem p = *GenProblem();
  StatusOr<JointLimitResult> limit = JointLimit(p);
  if (!limit.ok()) return;
  const std::vector<UnitChoice>& c = limit->choice;
  int64_t stays = 0;  // of units before the one considered
  for (size_t i = 0; i < p.units.size(); ++i) {
    const UnitCost& u = p.units[i];
    RC_ASSERT(Allowed(p, static_cast<int>(i), c[i]));
    const int64_t whole =
        c[i] == R ? u.input_bytes + u.recompute_bytes : u.saved_bytes;
    const bool reruns = c[i] == R || c[i] == S;
    const int64_t transient = std::max(
        u.backward_transient_bytes, reruns ? u.forward_transient_bytes : 0);
    RC_ASSERT(stays + whole + transient <= p.budget);
    stays += c[i] == K   ? u.saved_bytes
             : c[i] == R ? u.input_bytes
             : c[i] == S ? u.selective_bytes
                         : 0;
    RC_ASSERT(stays + u.forward_transient_bytes <= p.budget);
  }
}

// More room or faster copies only relax the conditions.
RC_GTEST_PROP(JointLimitProperties, MoreBudgetOrBandwidthNeverRaisesIt, ()) {
  const JointProblem p = *GenProblem();
  StatusOr<JointLimitResult> limit = JointLimit(p);
  JointProblem roomier = p;
  roomier.budget += *rc::gen::inRange<int64_t>(1, 1000);
  JointProblem faster = p;
  faster.d2h_gbps *= *rc::gen::element(1.0, 2.0, 10.0);
  faster.h2d_gbps *= *rc::gen::element(1.0, 2.0, 10.0);
  for (const JointProblem& q : {roomier, faster}) {
    StatusOr<JointLimitResult> relaxed = JointLimit(q);
    if (!limit.ok()) continue;
    RC_ASSERT(relaxed.ok());
    RC_ASSERT(AtMost(relaxed->step_ns, limit->step_ns));
  }
}

}  // namespace
}  // namespace offload
