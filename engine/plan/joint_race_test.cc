// The warm-up race (engine/plan/joint_race.h) on stacks of identical units
// (joint_problem_testing.h: 300 bytes each, forward 100 ns, backward
// 200 ns), with steps and peaks scripted per candidate
// (joint_race_testing.h). Its lowering, rematch and out-of-memory cases are
// in joint_race_lowering_test.cc, joint_race_rematch_test.cc and
// joint_race_memory_test.cc.

#include "engine/plan/joint_race.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Budget 700 for four 300-byte units at 1 B/ns: the joint plan and three
// candidates (recompute-only, offload-only, the first unit recomputed). No
// new race for a faster plan over the budget (lowerings = 0; see
// AFasterTrialOverTheBudgetLowersAndRacesAgainKeepingThoseThatFit).
TEST(JointRaceTest, TheFastestCandidateThatFitsIsKeptAndChecked) {
  JointRace race = FourUnits(1.0, 700, 0, 0, /*lowerings=*/0);
  ASSERT_OK(race.Start());
  EXPECT_THAT(race.refusal(), IsEmpty());
  ASSERT_EQ(race.candidates().size(), 3u);
  // Steps and peaks per plan, in the order they run: the second is the
  // fastest but over the budget; the third is the fastest that fits.
  const double steps[] = {1500, 1100, 1200, 1300};
  const int64_t peaks[] = {600, 800, 650, 600};
  std::vector<std::string> ran;
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(race.Measuring(2 + 3 * k));
    ran.push_back(Choices(race.plan()));
    EXPECT_TRUE(RunCandidate(race, steps[k], peaks[k]).applied);
  }
  ASSERT_EQ(race.trials().size(), 4u);
  for (int k = 0; k < 4; ++k) {  // the first runs left out
    EXPECT_EQ(race.trials()[k].step_ns, steps[k]);
    EXPECT_EQ(race.trials()[k].peak_bytes, peaks[k]);
    EXPECT_EQ(Choices(race.trials()[k].plan.plan), ran[k]);
  }
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(Choices(race.plan()), ran[2]);
  // Its peak is checked in the next 4 iterations, then nothing is measured.
  for (int check = 0; check < 4; ++check) {
    EXPECT_TRUE(race.Measuring(14 + check));
    EXPECT_FALSE(race.Measured(1200, 650).applied);
  }
  EXPECT_FALSE(race.Measuring(18));
  EXPECT_EQ(Choices(race.plan()), ran[2]);
  EXPECT_FALSE(race.Measuring(26));  // past the warm-up anyway
}

// With a tolerance of 5 bytes, a peak 4 over the budget of 700 fits: the
// fastest trial is kept, and its checks at 704 lower nothing; a peak of
// 706 does not fit (the next fastest that fits is kept).
TEST(JointRaceTest, APeakWithinTheToleranceFits) {
  for (int64_t over : {704, 706}) {
    JointRace race = FourUnits(1.0, 700, 0, 0, /*lowerings=*/0, /*tolerance=*/5);
    ASSERT_OK(race.Start());
    ASSERT_EQ(race.candidates().size(), 3u);
    const double steps[] = {1500, 1100, 1200, 1300};
    const int64_t peaks[] = {600, over, 650, 600};
    std::vector<std::string> ran;
    for (int k = 0; k < 4; ++k) {
      ran.push_back(Choices(race.plan()));
      RunCandidate(race, steps[k], peaks[k]);
    }
    ASSERT_TRUE(race.settled());
    EXPECT_EQ(Choices(race.plan()), ran[over == 704 ? 1 : 2]) << over;
    if (over == 704) {
      for (int check = 0; check < 4; ++check) {
        EXPECT_FALSE(race.Measured(1100, 704).applied);
      }
      EXPECT_EQ(Choices(race.plan()), ran[1]);
    }
  }
}

// Every candidate fits; the one that offloads runs fastest. Faster by less
// than 1% (offload_tie) than the fastest that does not offload, that one
// is kept; by 5%, the one that offloads.
TEST(JointRaceTest, APlanThatOffloadsIsKeptOnlyWhereItIsClearlyFaster) {
  for (double lead : {0.005, 0.05}) {
    JointRace race = FourUnits(1.0, 700, 0, 0, /*lowerings=*/0);
    ASSERT_OK(race.Start());
    std::vector<bool> offloads = {race.plan().offloaded_bytes > 0};
    for (const RacePlan& c : race.candidates()) {
      offloads.push_back(c.plan.offloaded_bytes > 0);
    }
    ASSERT_EQ(offloads.size(), 4u);
    const auto first_offloading = std::find(offloads.begin(), offloads.end(), true);
    ASSERT_NE(first_offloading, offloads.end());
    ASSERT_NE(std::find(offloads.begin(), offloads.end(), false), offloads.end());
    std::vector<std::string> ran;
    for (size_t k = 0; k < offloads.size(); ++k) {
      // The first plan that offloads: 1000 ns; the others without copies
      // 1000 / (1 - lead) and slower; other offloading ones slower still.
      const bool fastest = static_cast<long>(k) == first_offloading - offloads.begin();
      const double step = fastest ? 1000
                          : offloads[k] ? 2000 + k
                                        : 1000 / (1 - lead) + k;
      ran.push_back(Choices(race.plan()));
      RunCandidate(race, step, 600);
    }
    ASSERT_TRUE(race.settled());
    size_t plain = 0;  // the fastest plan without copies: the first of them
    while (offloads[plain]) ++plain;
    EXPECT_EQ(Choices(race.plan()),
              lead < 0.01 ? ran[plain] : ran[first_offloading - offloads.begin()])
        << lead;
  }
}

// A plan doing more work than another that fits is not kept, however
// fast it measured: checkpoint-only, four units of 300 bytes (a re-run
// keeps 30) in 680, 646 with the 5% margin. The plans for 646 re-run the
// first three (RRKK would need 660); checkpointing's own without the
// margin re-runs two, and measures to fit. Each trial measures faster the more units it re-runs
// (the race's noise at its worst): the kept plan is one no other fitting
// trial does less work than, where the fastest was one that did more.
TEST(JointRaceTest, APlanDoingMoreWorkThanAnotherThatFitsIsNotKept) {
  // Checkpointing's own is raced with and without the margin.
  JointRace race = CheckpointOnlyFourUnits(680, 0.05);
  ASSERT_OK(race.Start());
  while (!race.settled()) {
    const std::string c = Choices(race.plan());
    RunCandidate(race, 1000 - 10 * std::count(c.begin(), c.end(), 'R'), 600);
  }
  std::vector<std::string> ran;
  std::string fastest;
  double least = 1e18;
  for (const RaceTrial& t : race.all_trials()) {
    ran.push_back(Choices(t.plan.plan));
    if (t.step_ns < least) least = t.step_ns, fastest = ran.back();
  }
  auto more_work = [](const std::string& a, const std::string& b) {
    if (a == b) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (b[i] != 'K' && a[i] != b[i]) return false;
    }
    return true;
  };
  const std::string kept = Choices(race.plan());
  for (const std::string& other : ran) {
    EXPECT_FALSE(more_work(kept, other)) << kept << " over " << other;
  }
  // The race had such a pair: its fastest trial did more work than another.
  EXPECT_TRUE(std::any_of(ran.begin(), ran.end(), [&](const std::string& o) {
    return more_work(fastest, o);
  })) << ::testing::PrintToString(ran);
  EXPECT_NE(kept, fastest);
  EXPECT_EQ(kept, "RRKK");
}

// The least-work rule itself (DoesMoreWork), with the fifth choice:
// selective-offload does selective's work and its copies, so a plan with
// it is never kept over the same plan with selective there; neither it nor
// recompute does more than the other; offload does more than keep only.
// (No scripted race tried such a pair: a race's candidates are the joint
// plan, recompute-only, offload-only and checkpointing, and where the
// selective plan fits the joint plan needs no copies of it.)
TEST(JointRaceTest, SelectiveOffloadDoesTheWorkOfSelectiveAndItsCopies) {
  auto more = [](const std::string& a, const std::string& b) {
    auto of = [](const std::string& s) {
      std::vector<UnitChoice> c;
      for (char x : s) {
        c.push_back(x == 'K'   ? UnitChoice::kKeep
                    : x == 'O' ? UnitChoice::kOffload
                    : x == 'R' ? UnitChoice::kRecompute
                    : x == 'S' ? UnitChoice::kSelective
                               : UnitChoice::kSelectiveOffload);
      }
      return c;
    };
    return DoesMoreWork(of(a), of(b));
  };
  EXPECT_TRUE(more("QSKK", "SSKK"));
  EXPECT_TRUE(more("QQKK", "SQKK"));
  EXPECT_TRUE(more("QKKK", "KKKK"));
  EXPECT_TRUE(more("RSKK", "SSKK"));
  EXPECT_TRUE(more("OKKK", "KKKK"));
  EXPECT_FALSE(more("SSKK", "QSKK"));  // less work
  EXPECT_FALSE(more("QSKK", "RSKK"));  // neither does the other's work
  EXPECT_FALSE(more("RSKK", "QSKK"));
  EXPECT_FALSE(more("QSKK", "OSKK"));  // selective-offload re-runs; offload does not
  EXPECT_FALSE(more("OSKK", "QSKK"));
  EXPECT_FALSE(more("QSKK", "QSKK"));  // the same plan
  EXPECT_FALSE(more("QSK", "SSKK"));   // other units
}

// The warm-up's iterations end while the third plan runs: of the two
// measured, the one that fits is kept though the other was faster.
TEST(JointRaceTest, TheWarmUpEndingMidRaceKeepsTheFastestThatFit) {
  JointRace race = FourUnits(1.0, 700);
  ASSERT_OK(race.Start());
  const std::string first = Choices(race.plan());
  RunCandidate(race, 1500, 600);
  RunCandidate(race, 1100, 800);
  race.Measured(1.0, 0);               // the third plan's first run
  EXPECT_FALSE(race.WarmUpEnded(25));  // still measured
  EXPECT_TRUE(race.WarmUpEnded(26));
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(Choices(race.plan()), first);
  EXPECT_FALSE(race.Measuring(27));
  EXPECT_FALSE(race.WarmUpEnded(27));  // once
}

// The warm-up ends with every plan measured over: the lowest is kept and
// the caller's budget refused, as where the race gives up.
TEST(JointRaceTest, TheWarmUpEndingWithNothingThatFitRefusesTheBudget) {
  JointRace race = FourUnits(1.0, 700);
  ASSERT_OK(race.Start());
  const std::string first = Choices(race.plan());
  RunCandidate(race, 1500, 760);
  RunCandidate(race, 1100, 800);
  race.Measured(1.0, 0);  // the third plan's first run
  EXPECT_TRUE(race.WarmUpEnded(26));
  EXPECT_EQ(Choices(race.plan()), first);
  EXPECT_THAT(race.refusal(), HasSubstr("the smallest that fits as measured is 760 bytes"));
  EXPECT_EQ(race.budget(), 760);
}

// At 3 B/ns and budget 700 the joint plan offloads units 0 and 1. Its step
// measures what the model predicts at 0.75 B/ns: the bandwidths are fitted
// to about that, and the joint plan made with them (unit 1 recomputed
// instead, a choice not raced yet) runs next.
TEST(JointRaceTest, ASlowerMeasuredStepFitsTheBandwidthsAndPlansAgain) {
  JointRace race = FourUnits(3.0, 700);
  ASSERT_OK(race.Start());
  ASSERT_EQ(Choices(race.plan()), "OOKK");
  JointProblem slow = Stack(4, 0.75, race.units_budget());
  ASSERT_OK_AND_ASSIGN(JointPlan predicted,
                       EvaluateJoint(slow, Recomputed(race.plan())));
  RaceStep step = RunCandidate(race, predicted.step_ns, 600);
  EXPECT_TRUE(race.calibrated());
  EXPECT_NEAR(race.d2h_gbps(), 0.75, 0.01);
  EXPECT_NEAR(race.h2d_gbps(), 0.75, 0.01);
  EXPECT_TRUE(step.applied);
  EXPECT_EQ(Choices(race.plan()), "ORKK");
  JointProblem fitted = Stack(4, race.d2h_gbps(), race.units_budget());
  ASSERT_OK_AND_ASSIGN(
      JointPlan again,
      EvaluateJoint(fitted, Recomputed(race.all_trials()[0].plan.plan)));
  EXPECT_NEAR(again.step_ns, predicted.step_ns, 0.01 * predicted.step_ns);
  // Once only: the next plan that offloads changes nothing.
  const size_t candidates = race.candidates().size();
  RunCandidate(race, 1e9, 600);
  EXPECT_EQ(race.d2h_gbps(), race.h2d_gbps());
  EXPECT_NEAR(race.d2h_gbps(), 0.75, 0.01);
  EXPECT_EQ(race.candidates().size(), candidates - 1);
  // A step no slower than predicted changes nothing either.
  const double fitted_gbps = race.d2h_gbps();
  race.Calibrate(0.0, Recomputed(race.plan()));
  EXPECT_EQ(race.d2h_gbps(), fitted_gbps);
}

// Selective units (SelectiveStack: 60 bytes kept, 10 ns re-runs) at 3
// B/ns, budget 700: the candidates may hold selective units, and Calibrate fits
// the bandwidths to a measured step of a choice with one, the selective
// re-run counted (a plan of {K, S, K, K} releases unit 0 for unit 3).
TEST(JointRaceTest, CalibratesAPlanWithSelectiveUnits) {
  const JointProblem units = SelectiveStack(4, 3.0, 1);
  JointRace race(units.units, 3.0, 3.0, 700, 0, true, true, {0, 1, 2, 3},
                 JointRaceOptions{.margin = 0});
  ASSERT_OK(race.Start());
  // Copies that hide win the joint plan (OOKK); the recompute-only
  // candidate re-runs three units selectively.
  EXPECT_EQ(Choices(race.plan()), "OOKK");
  ASSERT_FALSE(race.candidates().empty());
  EXPECT_EQ(Choices(race.candidates()[0].plan), "SSSK");
  JointProblem slow = SelectiveStack(4, 0.75, race.units_budget());
  const std::vector<UnitChoice> choice = {
      UnitChoice::kKeep, UnitChoice::kSelective, UnitChoice::kKeep,
      UnitChoice::kKeep};
  ASSERT_OK_AND_ASSIGN(JointPlan predicted, EvaluateJoint(slow, choice));
  ASSERT_EQ(Choices(predicted), "OSKK");
  race.Calibrate(predicted.step_ns, choice);
  EXPECT_TRUE(race.calibrated());
  EXPECT_NEAR(race.d2h_gbps(), 0.75, 0.01);
  EXPECT_NEAR(race.h2d_gbps(), 0.75, 0.01);
}

// Budget 200 with 50 bytes outside and the 1% margin leaves the units 148;
// the least any plan of them fits is 300 (SmallestJointBudget), so the
// budget named is (300 + 50) / 0.99 + 1, rounded down.
TEST(JointRaceTest, ABudgetNoPlanFitsIsRefusedNamingTheSmallest) {
  JointRace race = FourUnits(1.0, 200, 50, 0.01);
  ASSERT_OK(race.Start());
  EXPECT_EQ(race.refusal(),
            "actoffload: a budget of 200 bytes cannot be kept (the step needs "
            "50 bytes beside the 4 units and the head, and no "
            "keep/offload/recompute plan of them fits the rest); the smallest "
            "that fits is 354 bytes, planned for that instead");
  EXPECT_EQ(race.budget(), 354);
  EXPECT_EQ(race.units_budget(), 300);
  EXPECT_LE(race.plan().peak_bytes, 300);
  EXPECT_TRUE(race.candidates().empty());
}

// A machine whose peaks are the model's (the profiled units, at the
// plan's budget) plus `recompute` bytes per unit recomputed in full,
// `selective` per selective one and `offload` per offloaded one, and whose
// steps are the model's.
struct World {
  JointProblem units;
  int64_t outside = 0;
  int64_t recompute = 0, selective = 0, offload = 0;

  int64_t Peak(const RacePlan& p) const {
    JointProblem at = units;
    at.budget = p.budget;
    StatusOr<JointPlan> plan = EvaluateJoint(at, p.plan.choice);
    EXPECT_OK(plan.status());
    int64_t peak = plan->peak_bytes + outside;
    for (UnitChoice c : p.plan.choice) {
      if (c == UnitChoice::kRecompute) peak += recompute;
      if (c == UnitChoice::kSelective) peak += selective;
      if (c == UnitChoice::kOffload) peak += offload;
    }
    return peak;
  }
};

// Runs the race in `world` until it settles (at most 40 candidates).
void RunInWorld(JointRace& race, const World& world) {
  for (int k = 0; k < 40 && !race.settled(); ++k) {
    RunCandidate(race, race.plan().step_ns, world.Peak(race.race_plan()));
  }
  ASSERT_TRUE(race.settled());
}

// Each recomputed unit holds 40 bytes above the model (at 1 B/ns, budget
// 700, nothing offloaded raced that does not also recompute): the fit finds
// 40, the units' inputs grow by it, and the kept plan fits as measured,
// predicted exactly by the fitted units.
TEST(JointRaceTest, FitsTheBytesRecomputedUnitsHoldBeyondTheModel) {
  World world{Stack(4, 1.0, 1), 0, 40, 0, 0};
  JointRace race(world.units.units, 1.0, 1.0, 700, 0, true, true,
                 {0, 1, 2, 3}, JointRaceOptions{.margin = 0});
  ASSERT_OK(race.Start());
  RunInWorld(race, world);
  EXPECT_EQ(race.recompute_excess(), 40);
  EXPECT_EQ(race.selective_excess(), 0);
  for (const UnitCost& u : race.units()) EXPECT_EQ(u.input_bytes, 70);
  EXPECT_LE(world.Peak(race.race_plan()), 700);
}

// Selective units 25 bytes above the model, recomputed ones 40 and
// offloaded ones 10 (fitted beside them, not applied): both re-run kinds
// are found, and every plan raced after the first fit that re-runs units
// is predicted as measured, less its offloads' excess.
TEST(JointRaceTest, FitsSelectiveAndRecomputedUnitsApartFromOffloadedOnes) {
  World world{SelectiveStack(4, 1.0, 1), 5, 40, 25, 10};
  // Every candidate runs: three kinds of excess need three trials.
  JointRace race(world.units.units, 1.0, 1.0, 705, 5, true, true,
                 {0, 1, 2, 3}, JointRaceOptions{.margin = 0, .prune = kNoPrune});
  ASSERT_OK(race.Start());
  RunInWorld(race, world);
  ASSERT_GE(race.all_trials().size(), 3u);
  EXPECT_EQ(race.recompute_excess(), 40);
  EXPECT_EQ(race.selective_excess(), 25);
  EXPECT_LE(world.Peak(race.race_plan()), 705);
}

// Without the fit the same machine keeps a plan that re-runs units by the
// lowering alone (fit_excess false: the excesses stay 0).
TEST(JointRaceTest, WithoutTheFitTheExcessesStayZero) {
  World world{Stack(4, 1.0, 1), 0, 40, 0, 0};
  JointRaceOptions options{.margin = 0};
  options.fit_excess = false;
  JointRace race(world.units.units, 1.0, 1.0, 700, 0, true, true,
                 {0, 1, 2, 3}, options);
  ASSERT_OK(race.Start());
  RunInWorld(race, world);
  EXPECT_EQ(race.recompute_excess(), 0);
  for (const UnitCost& u : race.units()) EXPECT_EQ(u.input_bytes, 30);
}

// Budget 700 for four units at 1 B/ns: the offload-only candidate is
// predicted more than 15% slower than the joint plan, so it is not raced;
// without pruning it is.
TEST(JointRaceTest, ACandidatePredictedClearlySlowerThanTheJointPlanIsNotRaced) {
  auto offload_only = [](const JointRace& race) {
    for (const RacePlan& c : race.candidates()) {
      if (Choices(c.plan).find('R') == std::string::npos &&
          Choices(c.plan).find('O') != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  JointRace all = FourUnits(1.0, 700);
  ASSERT_OK(all.Start());
  ASSERT_TRUE(offload_only(all));
  JointRaceOptions options;
  options.margin = 0;
  options.fit_excess = false;
  JointRace pruned(Stack(4, 1.0, 1).units, 1.0, 1.0, 700, 0, true, true,
                   {0, 1, 2, 3}, options);
  ASSERT_OK(pruned.Start());
  EXPECT_FALSE(offload_only(pruned));
  for (const RacePlan& c : pruned.candidates()) {
    EXPECT_LE(c.plan.step_ns, pruned.plan().step_ns * 1.15) << Choices(c.plan);
  }
  EXPECT_LT(pruned.candidates().size(), all.candidates().size());
}

// The first trial fits and runs at half the joint plan's predicted step (a
// machine faster than profiled): every later candidate is predicted more
// than 15% slower than it, so none runs and the first is kept.
TEST(JointRaceTest, ACandidatePredictedClearlySlowerThanAFittingTrialIsSkipped) {
  JointRaceOptions options;
  options.margin = 0;
  options.fit_excess = false;
  options.lowerings = 0;
  JointRace race(Stack(4, 1.0, 1).units, 1.0, 1.0, 700, 0, true, true,
                 {0, 1, 2, 3}, options);
  ASSERT_OK(race.Start());
  ASSERT_FALSE(race.candidates().empty());
  const std::string first = Choices(race.plan());
  EXPECT_TRUE(RunCandidate(race, race.plan().step_ns / 2, 600).applied);
  EXPECT_TRUE(race.settled());
  EXPECT_EQ(race.trials().size(), 1u);
  EXPECT_EQ(Choices(race.plan()), first);
}

// Checkpointing's own choice for the budget without the margin, where the
// margin costs it a unit: budget 1000 with a 10% margin leaves the units
// 900, where one first unit recomputed (predicted 930) does not fit, two
// (660) do; without the margin one does. Both run, and the faster, measured
// within the budget, is kept.
TEST(JointRaceTest, CheckpointingWithoutTheMarginIsRacedWhereItNeedsAUnitLess) {
  JointRace race = CheckpointOnlyFourUnits(1000, 0.1);
  ASSERT_OK(race.Start());
  EXPECT_EQ(race.units_budget(), 900);
  std::vector<std::string> plans = {Choices(race.plan())};
  for (const RacePlan& c : race.candidates()) plans.push_back(Choices(c.plan));
  EXPECT_THAT(plans, ::testing::Contains("RKKK"));
  EXPECT_THAT(plans, ::testing::Contains("RRKK"));
  // Each runs at its predicted step and peak.
  while (!race.settled()) {
    RunCandidate(race, race.plan().step_ns, race.plan().peak_bytes);
  }
  EXPECT_EQ(Choices(race.plan()), "RKKK");
}

// Refused (the smallest is planned instead), and every plan then measures
// over that smallest: the budget becomes the lowest measured peak, the
// smallest that fits as measured, and the warning says so.
TEST(JointRaceTest, AfterARefusalTheSmallestBecomesTheLowestMeasured) {
  JointRace race = FourUnits(1.0, 50);
  ASSERT_OK(race.Start());
  ASSERT_THAT(race.refusal(), HasSubstr("the smallest that fits is"));
  const int64_t smallest = race.budget();
  RaceStep last;
  for (int k = 0; k < 12 && !race.settled(); ++k) {
    last = RunCandidate(race, 1000, smallest + 100 + k);
  }
  ASSERT_TRUE(race.settled());
  EXPECT_THAT(last.warning, HasSubstr("the smallest that fits as measured"));
  EXPECT_EQ(race.budget(), smallest + 100);
  EXPECT_EQ(race.all_trials().front().peak_bytes, smallest + 100);
  EXPECT_EQ(Choices(race.plan()), Choices(race.all_trials().front().plan.plan));
}

TEST(JointRaceTest, AMalformedProblemIsRefusedAtStart) {
  JointRace race(Stack(2, 1.0, 1).units, 1.0, 1.0, 600, 0, true, true, {0, 2});
  EXPECT_THAT(race.Start(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("index 2")));
  JointRace no_bandwidth(Stack(2, 1.0, 1).units, 0, 0, 600, 0, true, true,
                         {0, 1});
  EXPECT_THAT(no_bandwidth.Start(), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace offload
