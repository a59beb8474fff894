// The budget's policy for batches longer than the one its race profiled
// (SPEC §7.8). Dynamic padding feeds batches of many lengths; joint_length.h
// makes a plan for one length. This says which of those plans serves when:
//   - in the race (the warm-up), a longer batch runs, for its forward
//     alone, the plan for the longest batch the race has seen;
//   - after the warm-up, a batch longer than every one before gets a plan
//     for its length. The lengths planned for are rungs: a batch runs the
//     plan of the shortest rung at or above its length (the race's own plan
//     at the profiled length), where the caller can tell its length before
//     its first unit; else the plan of the longest rung, which serves every
//     batch. A batch shorter than the profiled one, at least an eighth
//     from every shorter length planned for before, gets a lighter plan
//     (PlanForShorter), a rung below the profiled length. A rung's first
//     steps on batches of its length are checked: a peak over the budget
//     makes a longer rung's plan anew with the growth it measured
//     (PlanForLengthMeasured), checked in turn, and drops a shorter rung;
//   - a step of such a plan that runs out of device memory gives way to the
//     plan for its length predicted below it, where that one has not failed
//     there before (PlanForLengthBelow), else to the last plan a whole step
//     of that length ran, else it runs on.
// The caller (the PyTorch package's budget_lengths.py) sees the batches,
// reads the peaks, applies the plans and warns; each plan made here carries
// a number the caller hands back to name it; each is kept, so that any
// number handed back names it (a few per length a run meets: the longest
// only grow, and the shorter lengths planned for are an eighth apart). Pure, as the race is: no backend,
// no clock, nothing but the race it plans with.

#ifndef OFFLOAD_ENGINE_PLAN_LONGER_BATCHES_H_
#define OFFLOAD_ENGINE_PLAN_LONGER_BATCHES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "engine/plan/joint_length.h"
#include "engine/plan/joint_race.h"
#include "engine/status.h"

namespace offload {

// A plan for longer batches, as LongerBatches made it.
struct LongerPlan {
  int id = 0;         // its number here (from 1; 0 names no plan made here)
  double ratio = 1;   // the batch's size over the profiled one's it is for
  LengthPlan length;  // the plan, its problem and the budget it needs
};

class LongerBatches {
 public:
  // `checked_steps` (>= 0): how many steps on batches of its length a plan
  // made after the warm-up has its peak checked. `max_rungs` (>= 1): the
  // most rungs kept (each is a plan the caller keeps an engine loop for,
  // with its host buffers).
  // REQUIRES: `race` outlives this object, and its Start() succeeded before
  //   any call below.
  LongerBatches(JointRace& race, int checked_steps, int max_rungs = kMaxRungs);
  static constexpr int kMaxRungs = 4;

  // --- In the race -----------------------------------------------------------
  // A forward's batch is `ratio` times the profiled one's size, as its
  // first module call shows. Returns, for that forward alone, the plan for
  // the longest batch the race has seen, this one included (made once per
  // such longest, the same plan and number for each forward after); no
  // plan where ratio <= 1.
  // Errors: PlanForLength's, once per longest (no plan after it).
  StatusOr<std::optional<LongerPlan>> ForOneForward(double ratio);

  // In the race, a step on a batch `ratio` times the profiled one's size
  // ran plan `id` (ForOneForward's), or the race's own plan where id is 0,
  // and peaked at `measured_peak_bytes` above its forward's start. Over the
  // budget (the plan's needs_budget where larger) beyond the tolerance, the
  // units' bytes grew faster than the model took them to: the growth is
  // fitted as for a checked step (PlanForLengthMeasured raises the race's
  // length_exponent()), and the plans for longer batches made from then on,
  // the race's own for its longest and the warm-up's end's, grow so.
  // Returns whether the growth was raised; false where ratio <= 1, or
  // where plan `id` was made for another length (a batch shorter than the
  // longest the race had seen: its figures are not that length's).
  // Errors: kInvalidArgument where `id` is neither 0 nor a plan made here
  //   (nothing changes); PeakAtLength's and PlanForLengthMeasured's (the
  //   growth may have been raised all the same).
  // Why: a batch of a new length after the warm-up ran a plan made with
  // the bytes growing as the tokens, and its first step was over the budget
  // on eager attention (GPU run 141: 569 MB for 479 MB), though the race may
  // have run batches that long and shown how the bytes grow.
  StatusOr<bool> RaceStepMeasured(double ratio, int id, int64_t measured_peak_bytes);

  // In the race, the first unit confirmed a batch `ratio` times the
  // profiled one's size: the warm-up's end plans for the longest.
  void RaceSaw(double ratio);
  double seen() const { return seen_; }

  // --- After the warm-up -----------------------------------------------------
  // A batch `ratio` times the profiled one's size. Where it is longer than
  // every batch planned for so far (and than the profiled one), the plan
  // for it, a new rung, the longest: its next checked_steps steps on
  // batches of its length are checked (CheckBegins). Else none. A shorter
  // rung whose plan runs as the next longer rung's does is dropped (its
  // batches run that one, alike); then, beyond max_rungs, the rung
  // nearest below the next longer one (by ratio) is dropped, its batches
  // running that one, until max_rungs are left.
  // Why: lengths that grow step by step (a sequence-length warm-up) would
  // make a rung, an engine loop and its host buffers per length.
  // Errors: PlanForLength's; the length counts as planned for all the same
  //   (no rung is made for it: the longest rung's plan serves it).
  StatusOr<std::optional<LongerPlan>> Longest(double ratio);

  // The plan for a batch `ratio` times the profiled one's size, where its
  // size is known before its first unit: Longest(ratio) where that makes a
  // plan; for a batch shorter than the profiled one, at least an eighth
  // from every shorter length planned for before (kShorterApart: shorter
  // or longer than it), PlanForShorter's, a rung of its own where it is
  // lighter than the race's (checked as a longer rung is: a step over the
  // budget drops it, and its length is never planned for again); else the plan of the shortest rung at or above it, or of
  // the longest rung where none is that long (a length no plan could be
  // made for). None: the race's own plan serves it (the profiled length,
  // a shorter one with no rung at or above it below the profiled, or no
  // rung at all).
  // Errors: Longest's (no rung changes).
  // Why: the longest's plan fits every shorter batch, but holds more than
  // it needs to: GPU run 154, Llama h2048 eager at 0.7 of the peak, batches
  // of 2048 tokens under the plan for 3072 ran at 2.07-2.44 of their plain
  // step, and at 1.5-2.0 under their own in the race. Shorter lengths an
  // eighth apart: before, only a batch shorter than every one before got a
  // plan, and batches of 1536 tokens after one of 1024 ran the race's plan
  // (GPU run 164, hidden 4096: 1.24 of their plain step, 1.17 on their
  // own); a length per batch would make a plan per length dynamic padding
  // feeds.
  StatusOr<std::optional<LongerPlan>> ForBatch(double ratio);
  // Shorter lengths planned for are at least this factor apart.
  static constexpr double kShorterApart = 1.125;

  // The longest rung's plan, which serves every batch (a forward whose
  // size is not known before its first unit runs it), or none (no rung
  // longer than the profiled batch): the race's own plan.
  std::optional<LongerPlan> ForEveryBatch() const;

  // The rungs' plans, shortest first.
  std::vector<LongerPlan> Rungs() const;

  // The longest batch planned for after the warm-up (1 before any).
  double longest() const { return longest_; }

  // The warm-up ended: Longest(seen()).
  StatusOr<std::optional<LongerPlan>> WarmUpEnded() { return Longest(seen_); }

  // A step begins with plan number `in_force` in force (0: a plan not made
  // here). Returns whether it is a checked step: its peak is to be read from
  // its first unit on, where the batch has the plan's length
  // (StepChecked). A plan's checks end when they are spent or when another
  // plan takes its rung; steps of other plans between them leave them be.
  bool CheckBegins(int in_force) const { return checks_.count(in_force) > 0; }

  struct CheckedStep {
    // None: the step held the budget (the plan's own needs_budget where
    // larger). Else the plan that serves from now on, made with the growth
    // of the bytes the step measured (the race's length_exponent()).
    std::optional<LongerPlan> plan;
    // The plan is the checked one's choice and schedule with new figures:
    // none holds less at that growth, and the checks end. Else it is
    // checked in turn.
    bool same = false;
    // A shorter batch's plan measured over the budget: its rung is gone,
    // and its batches run the next longer plan (no plan comes).
    bool dropped = false;
  };
  // A checked step of plan `id`, on a batch of its length, peaked at
  // `measured_peak_bytes` above its forward's start. A step that held counts
  // one of the checks; the last ends them.
  // Errors: kFailedPrecondition where `id` is not checked (CheckBegins;
  //   nothing changes); PlanForLengthMeasured's (the checks end).
  StatusOr<CheckedStep> StepChecked(int id, int64_t measured_peak_bytes);

  struct GivingWay {
    // The plan for the failed plan's length predicted below it, which has
    // not failed at that length: it takes that length's rung, checked in
    // turn (where the rung was dropped since, it runs until the next
    // forward's plan for every batch, unchecked).
    std::optional<LongerPlan> plan;
    // Else, where nonzero, the plan a whole step of that length ran last
    // since that length's first failure: it takes the rung again.
    int again = 0;
    // The failed plan was the first to fail at its length.
    bool first_at_length = false;
    // Where no plan: PlanForLengthBelow's error, or OK where the plan it
    // made failed at that length before. Where neither plan nor again,
    // the failed plan runs on (shorter batches would fit).
    Status why;
    // The failed plan was a shorter batch's, holding its rung: the rung is
    // gone, its batches run the next longer plan (nothing else is set).
    bool dropped = false;
  };
  // After the warm-up, a step of plan `failed` ran out of device memory;
  // `held` is the plan the last step whose backward ended ran (0 where none
  // or not made here). A `held` from before the first failure at the failed
  // plan's length ran on more memory than the device holds now, and is not
  // taken: the caller forgets it where first_at_length.
  // Errors: kInvalidArgument where `failed` is not a plan made here
  //   (nothing changes).
  StatusOr<GivingWay> OutOfMemory(int failed, int held);

  // The plan numbered `id`, or nullptr.
  const LongerPlan* Find(int id) const;

 private:
  // A plan at a length, as it runs: its ratio, choices and schedule.
  using Key = std::tuple<double, std::vector<UnitChoice>, std::vector<int>,
                         std::vector<int>>;
  static Key KeyOf(const LongerPlan& plan);
  const LongerPlan& Keep(double ratio, LengthPlan length);
  void Arm(int id);
  // `plan` takes the rung at its length, where that length has one (a
  // plan made after the warm-up, its rung not dropped since); the checks
  // of the plan it replaces end. Returns whether it did.
  bool TakeRung(const LongerPlan& plan);
  // Drops rungs as Longest says, the longest never.
  void PruneRungs();
  // ForBatch for a batch shorter than the profiled one.
  std::optional<LongerPlan> ForShorter(double ratio);

  JointRace& race_;
  const int checked_steps_;
  const size_t max_rungs_;
  int next_id_ = 1;
  std::map<int, LongerPlan> plans_;
  double longest_ = 1.0;  // the longest batch planned for after the warm-up
  std::set<double> shorter_;  // lengths below 1 planned for after the warm-up
  double seen_ = 1.0;     // the longest batch the race saw
  // The race's plan for its longest: (ratio, plan id or 0 where it failed).
  std::optional<std::pair<double, int>> race_plan_;
  std::map<double, int> rungs_;  // length planned for after the warm-up -> plan
  std::map<int, int> checks_;    // plan checked -> its checks left
  std::set<Key> failed_;  // plans that ran out of memory at their length
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_LONGER_BATCHES_H_
