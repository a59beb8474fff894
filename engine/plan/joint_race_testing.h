// Helpers of the warm-up race's tests (engine/plan/joint_race.h): four of
// joint_problem_testing.h's identical units (300 bytes each, forward 100
// ns, backward 200 ns) raced with steps and peaks scripted per candidate.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_RACE_TESTING_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_RACE_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_testing.h"
#include "engine/plan/joint_race.h"
#include "gtest/gtest.h"

namespace offload {

// "OOKK": a plan's choices, one letter a unit.
inline std::string Choices(const JointPlan& plan) {
  std::string out;
  for (UnitChoice c : plan.choice) {
    out += c == UnitChoice::kKeep        ? 'K'
           : c == UnitChoice::kOffload   ? 'O'
           : c == UnitChoice::kSelective ? 'S'
           : c == UnitChoice::kSelectiveOffload ? 'Q'
                                                : 'R';
  }
  return out;
}

inline std::vector<bool> Recomputed(const JointPlan& plan) {
  std::vector<bool> r(plan.choice.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = plan.Recompute(i);
  return r;
}

// Every candidate runs, however slow the model predicts it.
inline constexpr double kNoPrune = 1e9;

// Four units at `gbps`, nothing outside them, no margin unless given; no
// rematch unless given (the Rematch tests'; the others script each
// candidate's runs in turn).
inline JointRace FourUnits(double gbps, int64_t budget, int64_t outside = 0,
                    double margin = 0, int lowerings = 2,
                    int64_t tolerance = 0, double rematch = 0) {
  JointRaceOptions options;
  options.margin = margin;
  options.lowerings = lowerings;
  options.tolerance_bytes = tolerance;
  options.rematch = rematch;
  options.fit_excess = false;  // these scripts' peaks follow no model
  options.prune = kNoPrune;     // nor do their steps
  return JointRace(Stack(4, gbps, 1).units, gbps, gbps, budget, outside,
                   /*allow_offload=*/true, /*allow_recompute=*/true,
                   {0, 1, 2, 3}, options);
}

// FourUnits' units, recompute only (checkpointing), with `margin`; no new
// race for a faster plan over the budget.
inline JointRace CheckpointOnlyFourUnits(int64_t budget, double margin) {
  JointRaceOptions options;
  options.margin = margin;
  options.fit_excess = false;
  options.prune = kNoPrune;
  options.lowerings = 0;
  options.rematch = 0;
  return JointRace(Stack(4, 1.0, 1).units, 1.0, 1.0, budget, 0,
                   /*allow_offload=*/false, /*allow_recompute=*/true,
                   {0, 1, 2, 3}, options);
}

// A race on four Stack units at 1 B/ns, recompute only unless
// `allow_offload`, no margin, started (joint_length_test,
// longer_batches_test).
inline JointRace Started(int64_t budget, int64_t outside, bool allow_offload = false) {
  JointRaceOptions options;
  options.margin = 0;
  JointRace race(Stack(4, 1.0, 1).units, 1.0, 1.0, budget, outside,
                 allow_offload, /*allow_recompute=*/true, {0, 1, 2, 3}, options);
  EXPECT_TRUE(race.Start().ok());
  return race;
}

// Runs the plan in force `runs` times: first a run of 1 ns and no peak (one
// that would win every race, were it counted), then `step` and `peak`.
// What the last run changed.
inline RaceStep Run(JointRace& race, int runs, double step, int64_t peak) {
  EXPECT_TRUE(race.Measured(1.0, 0).warning.empty());
  RaceStep last;
  for (int i = 1; i < runs; ++i) last = race.Measured(step, peak);
  return last;
}

// A candidate's runs_per_candidate runs.
inline RaceStep RunCandidate(JointRace& race, double step, int64_t peak) {
  return Run(race, race.options().runs_per_candidate, step, peak);
}

// A rematch's rematch_runs runs of the plan in force again.
inline RaceStep RunAgain(JointRace& race, double step, int64_t peak) {
  return Run(race, race.options().rematch_runs, step, peak);
}

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_RACE_TESTING_H_
