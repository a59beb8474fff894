// The warm-up race of the PyTorch package's memory-budget mode (SPEC §4.8,
// §7.8; python/actoffload/budget.py): which joint plan
// (engine/plan/joint_plan.h) a training loop keeps, from the steps and
// peaks it measures. Pure data and functions of the planner: no backend,
// no clock. The caller profiles the model's first iteration into units,
// applies the plan in force (plan()) and reports each measured warm-up
// iteration (Measured).
//
// Its life:
//  - Start: the joint plan for the units' budget (the budget less a margin
//    and the bytes outside the units) and, as candidates, the
//    recompute-only and offload-only plans and checkpointing's own choice
//    (the fewest first units recomputed in full that fit; also for the
//    budget without the margin, where that needs fewer: the race measures
//    whether it fits). Candidates the model predicts clearly slower are
//    left out (JointRaceOptions::prune). The joint and
//    recompute-only plans may hold selective units (where the units allow
//    them). A budget no plan fits is refused (refusal(): the caller raises
//    it once) and the smallest that fits is planned instead.
//  - Race: each candidate runs runs_per_candidate times; the first run
//    (pinned buffers allocated) does not count, the least step and the
//    highest peak of the others are its trial. The first trial of a plan
//    that offloads fits the copy bandwidths to its step (Calibrate). Then
//    the fastest trial that fits the budget is kept (of those whose plan
//    does no more work than another's that fits: each unit's choice at
//    most the other's, keep < offload and keep < selective < recompute;
//    see also JointRaceOptions::offload_tie), its peak checked in
//    the next checked_iterations (but where a faster trial is over the
//    budget, the units' budget is lowered to its predicted peak less its
//    excess and the race runs again, the fitting trials kept: see
//    JointRaceOptions::worth_lowering); where none fits, the units' budget is
//    lowered by the least excess and planned anew; where it cannot be
//    lowered below the smallest, the recompute-only plan for its smallest
//    budget runs once (LastResort) and is kept if it fits; else the plan
//    measured lowest is kept, and its measured peak becomes the budget,
//    the smallest that fits as measured (KeepLowest: a refusal of the
//    caller's budget; a warning where the budget was refused already).
//    Before it settles, trials that the model predicts faster than the one
//    to keep, measured a little slower, run again in turn with it
//    (JointRaceOptions::rematch), and the least step of all runs counts.
//  - A kept plan whose checked peak is over is lowered the same way and the
//    race starts again (where it cannot be, KeepLowest with that peak).
//    Once warmup_iterations are spent, a race still running keeps the best
//    plan measured (WarmUpEnded).

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_RACE_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_RACE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/status.h"

namespace offload {

struct JointRaceOptions {
  // Each candidate runs this often (at least 2: the first does not count).
  int runs_per_candidate = 3;
  // The kept plan's peak is checked in this many iterations after it.
  int checked_iterations = 4;
  // The most measured iterations after the profile (Measuring).
  int warmup_iterations = 24;
  // The plan leaves this share of the budget spare (allocator rounding).
  double margin = 0.01;
  // A plan that offloads is kept over the fastest fitting trial that does
  // not only where it is faster by more than this share of that one's step:
  // offloading's step varies more (copies share PCIe and host memory with
  // the rest of the job), and within the race's noise the plan without
  // copies is kept. Why: on an H200, GPT-2 at 0.6 kept a plan that offloads
  // one layer, measured 1.2% faster in the race and 1.4% slower than
  // checkpointing's own plan in the timed steps after it.
  double offload_tie = 0.01;
  // A measured peak at most this far above the budget fits: the PyTorch
  // package passes one block of its caching allocator for large tensors
  // (2 MiB, probe.MemoryProbe.granularity), the step its peak moves in.
  // Why: on an H200 (the Llama at 0.3) a plan 3% faster than the
  // one kept measured 1 MiB over a 3882 MiB budget.
  int64_t tolerance_bytes = 0;
  // A trial faster than every one that fits by more than this share of
  // their step, but over the budget, lowers the units' budget to its
  // predicted peak less its excess, for a race of plans like it that may
  // fit; the trials that fit stay in that race. At most `lowerings` times.
  double worth_lowering = 0.02;
  int lowerings = 2;
  // Fit the bytes the model leaves out of re-run units after each trial
  // (FitExcess).
  bool fit_excess = true;
  // A candidate whose step the model predicts above the joint plan's (when
  // the candidates are planned) or above the fastest trial that fits
  // (before it runs, with the bandwidths and excesses fitted by then) by
  // more than this share is not run: its warm-up iterations would go to a
  // step the model already says loses. The model under-predicts plans that
  // offload much more often than it over-predicts (at most by 11% in the
  // runs of 2026-11-27), so this leaves out only clear losers. Why: on a
  // Hugging Face Llama (hidden 4096) the offload-only candidates measured
  // x1.5 to x1.8 of the joint plan, 9 of the race's 33 iterations.
  double prune = 0.15;
  // Before it settles, the race runs again the trials that fit, do no more
  // work than another that fits, are predicted faster than the one it would
  // keep and measured at most this share slower (up to rematch_plans - 1
  // of them, the lowest predicted first), each rematch_runs times, then
  // that one rematch_runs times. As in a candidate's runs, the first does
  // not count (where there are two or more); each trial's step becomes the
  // least of its runs, its peak the highest. Once per race (Start, each
  // Replan).
  // Why: a step measured slow for reasons of the moment (the host busy,
  // the clocks) stays in the race's trials. On an H200 (SDPA Llama h2048 at
  // 0.8) the race measured OOKKKKKR at 61.3 ms, 19% over its prediction,
  // and kept ROOKKKKK (54.0); timed after the race, OOKKKKKR ran 51.6 ms.
  // Where the one it would keep offloads, the fastest trial without copies
  // that fits, does no more work than another that fits and measured at
  // most this share slower runs again too (in one of those rematch_plans -
  // 1 places, after the others), however the model predicts it. Why: on an
  // H200 (GPT-2 at 0.6, GPU run 168) the race measured checkpointing's own
  // RRRRRRKK at 65.9 ms, 9% over its timed steps after the race (60.2),
  // and kept RRORRRKK (64.4), which the model predicted faster and which
  // timed 4.7% slower; that happens to the plan without copies as to any.
  double rematch = 0.2;
  int rematch_runs = 2;
  int rematch_plans = 3;
  // After the warm-up, a plan for a longer batch that ran out of memory
  // gives way to one predicted at least this share of its peak lower
  // (PlanForLengthBelow, joint_length.h): nothing measured it, and the
  // model's error at a length the race never ran is all the device said.
  // Why: on an H200 (GPU run 134) the plan for batches 1.25 times the
  // profiled one's size was predicted at 431 MB and peaked at 566 MB; each
  // plan after it predicted a byte lower, 9 steps failed in a row.
  double length_step = 0.125;
};

// A plan the race made, with the units' budget it was made for and the
// excesses (FitExcess) its units carried then.
struct RacePlan {
  JointPlan plan;
  int64_t budget = 0;
  int64_t recompute_excess = 0;
  int64_t selective_excess = 0;
};

// A candidate's runs, the first left out: the least step, the highest peak.
struct RaceTrial {
  double step_ns = 0;
  int64_t peak_bytes = 0;
  RacePlan plan;
};

// The race's least-work rule: whether choices `a` do more work than `b`,
// another assignment of the same units in which each unit's choice does
// no more work than in `a` (keep does the least; offload adds copies to
// keep; selective re-runs a unit's cheap ops, recompute its whole forward,
// selective-offload copies what selective keeps). Such a plan cannot be
// faster than `b`, whatever a race measured, and is never kept over it.
bool DoesMoreWork(const std::vector<UnitChoice>& a,
                  const std::vector<UnitChoice>& b);

// What a measured iteration changed.
struct RaceStep {
  bool applied = false;  // a plan was set in force: the caller applies plan()
  std::string warning;   // not empty: for the caller to warn with
};

class JointRace {
 public:
  // `units`: the profile's units in forward order (glue and the head
  // included); `index[u]`: the place in `units` of the caller's unit u (the
  // ones it can offload or recompute); `budget`: the whole step's bytes;
  // `outside`: the bytes beside the units throughout.
  JointRace(std::vector<UnitCost> units, double d2h_gbps, double h2d_gbps,
            int64_t budget, int64_t outside, bool allow_offload,
            bool allow_recompute, std::vector<int> index,
            JointRaceOptions options = {});

  // Plans the first time: plan() is the plan to apply. Where no plan fits
  // the units' budget, records refusal() and plans the smallest budget
  // that fits instead (budget() becomes it).
  // Errors: kInvalidArgument for a malformed problem
  //   (ValidateJointProblem, the budget aside) or an index out of range.
  // REQUIRES: called once, before any other method but the accessors.
  Status Start();

  // A measured iteration of plan() ended: its step and its peak above the
  // forward's start. Sets the next candidate, the kept plan or a lowered
  // one in force (applied) where the race says so.
  // REQUIRES: Start() succeeded.
  RaceStep Measured(double step_ns, int64_t peak_bytes);

  // A run of plan() ran out of device memory (a measured iteration or a
  // check), having reached `peak_bytes` above the forward's start: the
  // allocator's peak before the allocation that failed, less than the plan
  // needed. That plan never runs again and is never kept: its trials are
  // dropped. Where `peak_bytes` is below the budget, the device cannot
  // hold the budget, and the budget becomes `peak_bytes` (the returned
  // warning says so). The units' budget is then lowered by the distance of
  // `peak_bytes` from the budget (as it was) and the margin, and below the
  // failed plan's predicted peak (a plan predicted to hold more would fail
  // too), and the race plans anew, the trials that fit kept; where it
  // cannot be lowered, the race ends as when nothing measured fits
  // (LastResort, KeepLowest), and where every plan ran out of memory, the
  // smallest runs anyway, settled, warned about (RunSmallestAnyway).
  // Sets a plan in force (applied), where one is left that has not run out
  // of memory.
  // Why: near the device's memory, a candidate measured over the budget is
  // an out-of-memory error; a loop that catches it and skips the batch ran
  // the same candidate again at each iteration until the warm-up ended.
  // REQUIRES: Start() succeeded.
  RaceStep OutOfMemory(int64_t peak_bytes);
  // The choices of the plans that ran out of memory.
  const std::vector<std::vector<UnitChoice>>& out_of_memory() const {
    return out_of_memory_;
  }

  // After the warm-up, the device holds less than the units' budget says:
  // a plan made for a longer batch (joint_length.h: PlanForLengthBelow)
  // ran out of memory. The units' budget becomes `units_budget`, what
  // PlanForLength plans within from now on; the plan in force, its trials
  // and the budget stay (nothing measured them over it).
  // REQUIRES: units_budget < units_budget().
  void LowerUnitsBudget(int64_t units_budget) { units_budget_ = units_budget; }

  // The bytes of a batch `ratio` times the profiled one's size are taken to
  // grow as `ratio` to this power (joint_length.h): 1, linear in the
  // tokens, until a checked step of a plan for a longer batch measured
  // more (PlanForLengthMeasured raises it). Why: eager attention's scores
  // grow as the square of the tokens; on an H200 (GPU run 139) a plan for
  // batches 1.5 times the profiled size peaked at 530 MB where the linear
  // model said 402, and the plan predicted lower by that excess peaked at
  // 532 MB (a layer's re-run, not an offset, held the peak).
  double length_exponent() const { return length_exponent_; }
  // REQUIRES: exponent >= length_exponent().
  void RaiseLengthExponent(double exponent) { length_exponent_ = exponent; }

  // Whether iteration `iteration` (1 for the profile) is measured.
  bool Measuring(int iteration) const;

  // Where iteration `iteration` is no longer measured but the race has not
  // settled, settles on the best plan measured (SettleOnBest) and returns
  // true: the caller applies plan(). Else false.
  bool WarmUpEnded(int iteration);

  // Keeps the fastest plan measured within the budget, else the one
  // measured lowest (KeepLowest); no more checks.
  // REQUIRES: a trial since Start (all_trials() not empty).
  void SettleOnBest();

  // Fits the copy bandwidths to a measured step of a plan of `choice` (its
  // recomputed and selective units matter; kept and offloaded ones follow
  // from the budget): the fraction (1/16 to 1) of them at which the model
  // predicts `step_ns` less the time outside the units (what plans without
  // copies measured above their prediction, the least of them). Where the
  // model predicted less than measured, lowers them and puts the joint plan
  // made with them first among the candidates if its choice is new.
  void Calibrate(double step_ns, const std::vector<UnitChoice>& choice);
  // The same, `recompute[i]` true for a unit recomputed in full.
  void Calibrate(double step_ns, const std::vector<bool>& recompute);

  // Fits what the model leaves out of the measured peaks: the bytes each
  // unit recomputed in full, and each selective one, holds beyond what its
  // profile counts. By least squares over every trial since Start: its
  // measured peak above the profiled units' prediction of its plan (the
  // bytes outside the units added), in the counts of its
  // recomputed, selective and offloaded units, the three excesses not
  // negative. The offloaded units' excess is fitted so that it does not
  // bias the other two, but not applied: the model has no bytes an
  // offloaded unit leaves on device (the lowering corrects those). Then
  // the recomputed units save input_bytes plus the first, the selective
  // ones selective_bytes plus the second (both within saved_bytes), and
  // the joint plan made with them goes first among the candidates where
  // its choice is new. Measured calls it after each trial where
  // options().fit_excess. Why: on a Hugging Face Llama (SDPA, hidden 4096)
  // each recomputed layer measured 64 MiB above the model and each
  // selective one about 100 MiB, so plans of many re-runs went over.
  void FitExcess();
  int64_t recompute_excess() const { return recompute_excess_; }
  int64_t selective_excess() const { return selective_excess_; }

  const JointPlan& plan() const { return plan_.plan; }
  const RacePlan& race_plan() const { return plan_; }
  int64_t budget() const { return budget_; }
  int64_t units_budget() const { return units_budget_; }
  int64_t outside() const { return outside_; }
  double d2h_gbps() const { return d2h_gbps_; }
  double h2d_gbps() const { return h2d_gbps_; }
  // The profile's units, with the excesses FitExcess applied.
  const std::vector<UnitCost>& units() const { return units_; }
  const std::string& refusal() const { return refusal_; }
  const std::vector<RacePlan>& candidates() const { return candidates_; }
  // The trials since the candidates were last planned, and since Start.
  const std::vector<RaceTrial>& trials() const { return trials_; }
  const std::vector<RaceTrial>& all_trials() const { return all_trials_; }
  bool settled() const { return settled_; }
  int checks_left() const { return checks_left_; }
  bool calibrated() const { return calibrated_; }
  // Whether Measured fits the bandwidths at the next plan that offloads.
  void set_calibrated(bool calibrated) { calibrated_ = calibrated; }
  const JointRaceOptions& options() const { return options_; }
  bool allow_offload() const { return allow_offload_; }
  bool allow_recompute() const { return allow_recompute_; }

 private:
  JointProblem Problem(int64_t budget, bool offload, bool recompute) const;
  std::optional<JointPlan> PlanFor(int64_t budget, bool offload,
                                   bool recompute) const;
  // Plans the candidates for units_budget_ (the smallest where none fits)
  // and sets the first in force; a warning where the race had a plan.
  RaceStep Replan();
  void AddFirstUnitsRecomputed(std::vector<RacePlan>* candidates) const;
  // The units' budget less the excess of `peak` and the margin.
  int64_t Lowered(int64_t peak) const;
  // The most a measured peak may be and fit: the budget and the tolerance.
  int64_t Allowed() const { return budget_ + options_.tolerance_bytes; }
  int64_t SmallestUnits();
  // Before the race gives up (no plan measured within the budget, none
  // lowerable): the recompute-only plan for its smallest budget, once,
  // where recompute is allowed and it has not run. Re-runs are what the
  // model predicts best; offloads can leave bytes it does not count. Why:
  // on eager Llama blocks at 0.3 every raced plan offloaded and measured
  // 0.45-1.1 GiB over, and the one measured lowest (x4.3 of the step) was
  // kept over the budget.
  std::optional<RacePlan> LastResort();
  // Keeps the plan measured lowest, settled, and makes its measured peak
  // the budget. The caller's budget is refused (refusal()); a budget
  // refused already gets the returned warning instead.
  // REQUIRES: a trial since Start.
  std::string KeepLowest();
  void Apply(const RacePlan& plan);
  // A plan of the current units for `budget`, with their excesses.
  RacePlan Made(JointPlan plan, int64_t budget) const;

  // After the candidates: keeps the fastest trial that fits, or races plans
  // for a lowered budget, or rematches (StartRematch), or lowers where
  // nothing fits.
  RaceStep KeepOrRaceOn();
  // Where options_.rematch asks for it and this race has not rematched:
  // sets the first plan to run again in force and returns true.
  bool StartRematch(const RaceTrial& best);
  // The rematch runs of the plan in force are in: merged into its trials.
  void MergeRematchRuns();
  // Whether a plan of `choice` ran out of memory (OutOfMemory).
  bool RanOutOfMemory(const std::vector<UnitChoice>& choice) const;
  // The joint plan for the units' budget goes first among the candidates,
  // where its choice has not been raced, is not a candidate and did not run
  // out of memory (after the bandwidths or the excesses were fitted anew).
  void RaceJointPlanFirst();
  // The units' budget lowered to `lowered` and the candidates planned
  // again, the trials that fit kept (those candidates run no more).
  RaceStep LowerAndReplan(int64_t lowered);
  // Where every plan ran out of memory: the plan for the smallest units'
  // budget is put in force and kept, though it ran out of memory too (a
  // device that holds less than any plan; the allocator's blocks may still
  // serve it). Returns the warning to give, or "" where there is none.
  std::string RunSmallestAnyway();

  // Drops the candidates at the front that the model predicts slower than
  // the fastest trial that fits by more than options_.prune.
  void PruneCandidates();
  // `p`'s plan as the current units and bandwidths predict it (its own
  // where they do not fit its budget).
  JointPlan Predicted(const RacePlan& p) const;

  const std::vector<UnitCost> profiled_;  // as the caller measured them
  std::vector<UnitCost> units_;           // with the excesses
  const std::vector<int> index_;
  const int64_t outside_;
  const bool allow_offload_;
  const bool allow_recompute_;
  const JointRaceOptions options_;
  double d2h_gbps_;
  double h2d_gbps_;
  int64_t budget_;
  int64_t units_budget_;
  double length_exponent_ = 1.0;
  std::string refusal_;
  bool has_plan_ = false;
  RacePlan plan_;
  std::vector<RacePlan> candidates_;
  std::vector<std::pair<double, int64_t>> runs_;  // of the plan in force
  int lowerings_left_;  // of options_.lowerings
  std::vector<RaceTrial> trials_;
  std::vector<RaceTrial> all_trials_;
  bool settled_ = false;
  int checks_left_ = 0;
  bool calibrated_ = false;
  std::optional<int64_t> smallest_;  // the least units' budget, once asked
  bool last_resort_tried_ = false;
  bool rematched_ = false;           // in this race (since Start or Replan)
  std::vector<RacePlan> rematch_;    // to run again after the plan in force
  bool rematching_ = false;          // the plan in force runs again
  int64_t recompute_excess_ = 0;
  int64_t selective_excess_ = 0;
  std::vector<std::vector<UnitChoice>> out_of_memory_;  // never run again
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_RACE_H_
