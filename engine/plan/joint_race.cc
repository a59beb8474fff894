#include "engine/plan/joint_race.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace offload {
namespace {

bool SameChoice(const JointPlan& a, const JointPlan& b) {
  return a.choice == b.choice;
}

bool ChoiceIn(const JointPlan& plan, const std::vector<RacePlan>& plans) {
  return std::any_of(plans.begin(), plans.end(), [&](const RacePlan& p) {
    return SameChoice(plan, p.plan);
  });
}

bool ChoiceIn(const JointPlan& plan, const std::vector<RaceTrial>& trials) {
  return std::any_of(trials.begin(), trials.end(), [&](const RaceTrial& t) {
    return SameChoice(plan, t.plan.plan);
  });
}

// The first trial with the least (peak, step).
const RaceTrial& Lowest(const std::vector<RaceTrial>& trials) {
  return *std::min_element(trials.begin(), trials.end(),
                           [](const RaceTrial& a, const RaceTrial& b) {
                             return std::make_pair(a.peak_bytes, a.step_ns) <
                                    std::make_pair(b.peak_bytes, b.step_ns);
                           });
}

// Whether a unit choice `x` does at least the work of `y` (DoesMoreWork).
bool NoLessWork(UnitChoice x, UnitChoice y) {
  return x == y || y == UnitChoice::kKeep ||
         (y == UnitChoice::kSelective && (x == UnitChoice::kRecompute ||
                                          x == UnitChoice::kSelectiveOffload));
}

bool MoreWork(const JointPlan& a, const JointPlan& b) {
  return DoesMoreWork(a.choice, b.choice);
}

// The first fastest trial within `budget` (of those whose plan offloads
// nothing, with `without_copies`), or null. With `least_work`, a trial
// whose plan does more work than another's within the budget is passed
// over: measured faster, it was the race's noise (on an H200, GPT-2 at 0.8
// kept its first four layers re-run, 1.1% faster in the race than three,
// and 1.9% slower than checkpointing three in the timed steps after it).
const RaceTrial* FastestFitting(const std::vector<RaceTrial>& trials,
                                int64_t budget, bool without_copies = false,
                                bool least_work = false) {
  auto fits = [&](const RaceTrial& t) {
    return t.peak_bytes <= budget &&
           (!without_copies || t.plan.plan.offloaded_bytes == 0);
  };
  auto outdone = [&](const RaceTrial& t) {
    return least_work &&
           std::any_of(trials.begin(), trials.end(), [&](const RaceTrial& u) {
             return fits(u) && MoreWork(t.plan.plan, u.plan.plan);
           });
  };
  const RaceTrial* best = nullptr;
  for (const RaceTrial& t : trials) {
    if (fits(t) && (best == nullptr || t.step_ns < best->step_ns) &&
        !outdone(t)) {
      best = &t;
    }
  }
  return best;
}

// The trial to keep among those within `budget`: the fastest of those
// whose plan does no more work than another's that fits, unless it
// offloads and the fastest such that does not is within `tie` of its step
// (JointRaceOptions::offload_tie).
const RaceTrial* Kept(const std::vector<RaceTrial>& trials, int64_t budget,
                      double tie) {
  const RaceTrial* best = FastestFitting(trials, budget, /*without_copies=*/false,
                                         /*least_work=*/true);
  if (best == nullptr || best->plan.plan.offloaded_bytes == 0) return best;
  const RaceTrial* plain = FastestFitting(
      trials, budget, /*without_copies=*/true, /*least_work=*/true);
  return plain != nullptr && best->step_ns >= plain->step_ns * (1 - tie)
             ? plain
             : best;
}

// The fastest trial over `budget` that is faster than `best` by more than
// `share` of its step, or null.
const RaceTrial* FasterOver(const std::vector<RaceTrial>& trials,
                            const RaceTrial& best, int64_t budget,
                            double share) {
  const RaceTrial* faster = nullptr;
  for (const RaceTrial& t : trials) {
    if (t.peak_bytes > budget && t.step_ns < best.step_ns * (1 - share) &&
        (faster == nullptr || t.step_ns < faster->step_ns)) {
      faster = &t;
    }
  }
  return faster;
}

}  // namespace

bool DoesMoreWork(const std::vector<UnitChoice>& a,
                  const std::vector<UnitChoice>& b) {
  if (a == b || a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!NoLessWork(a[i], b[i])) return false;
  }
  return true;
}

JointRace::JointRace(std::vector<UnitCost> units, double d2h_gbps,
                     double h2d_gbps, int64_t budget, int64_t outside,
                     bool allow_offload, bool allow_recompute,
                     std::vector<int> index, JointRaceOptions options)
    : profiled_(units),
      units_(std::move(units)),
      index_(std::move(index)),
      outside_(outside),
      allow_offload_(allow_offload),
      allow_recompute_(allow_recompute),
      options_(options),
      d2h_gbps_(d2h_gbps),
      h2d_gbps_(h2d_gbps),
      budget_(budget),
      units_budget_(static_cast<int64_t>(budget * (1 - options.margin)) -
                    outside),
      lowerings_left_(options.lowerings) {}

JointProblem JointRace::Problem(int64_t budget, bool offload,
                                bool recompute) const {
  JointProblem p;
  p.units = units_;
  p.d2h_gbps = d2h_gbps_;
  p.h2d_gbps = h2d_gbps_;
  p.budget = budget;
  p.allow_offload = offload;
  p.allow_recompute = recompute;
  return p;
}

// Start validated the problem: a plan fails only where the budget does not
// fit (or is not positive).
std::optional<JointPlan> JointRace::PlanFor(int64_t budget, bool offload,
                                            bool recompute) const {
  if (budget <= 0) return std::nullopt;
  StatusOr<JointPlan> plan = PlanJoint(Problem(budget, offload, recompute));
  if (!plan.ok()) return std::nullopt;
  return *std::move(plan);
}

Status JointRace::Start() {
  OFFLOAD_RETURN_IF_ERROR(
      ValidateJointProblem(Problem(1, allow_offload_, allow_recompute_)));
  for (int place : index_) {
    if (place < 0 || place >= static_cast<int>(units_.size())) {
      return InvalidArgumentError("joint race: index " + std::to_string(place) +
                                  " out of " + std::to_string(units_.size()) +
                                  " units");
    }
  }
  Replan();
  return OkStatus();
}

RaceStep JointRace::Replan() {
  RaceStep out;
  rematched_ = false;
  rematching_ = false;
  rematch_.clear();
  std::optional<JointPlan> plan =
      PlanFor(units_budget_, allow_offload_, allow_recompute_);
  std::vector<RacePlan> candidates;
  if (plan.has_value()) {
    // The model's error is often larger than the candidates' difference:
    // each runs and the fastest that fits is kept.
    candidates = {Made(*plan, units_budget_)};
    for (auto [offload, recompute] :
         {std::pair(false, true), std::pair(true, false)}) {
      if ((offload && !allow_offload_) || (recompute && !allow_recompute_))
        continue;
      std::optional<JointPlan> other =
          PlanFor(units_budget_, offload, recompute);
      if (other.has_value() && !ChoiceIn(*other, candidates)) {
        candidates.push_back(Made(*other, units_budget_));
      }
    }
    if (allow_recompute_) AddFirstUnitsRecomputed(&candidates);
    candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                    [&](const RacePlan& c) {
                                      return RanOutOfMemory(c.plan.choice);
                                    }),
                     candidates.end());
  }
  if (!candidates.empty()) {  // (none: no plan fits, or each ran out of memory)
    const double slowest = candidates.front().plan.step_ns * (1 + options_.prune);
    candidates.erase(
        std::remove_if(candidates.begin() + 1, candidates.end(),
                       [&](const RacePlan& c) { return c.plan.step_ns > slowest; }),
        candidates.end());
    candidates_.assign(candidates.begin() + 1, candidates.end());
    trials_.clear();
    Apply(candidates.front());
    out.applied = true;
    return out;
  }
  StatusOr<int64_t> least =
      SmallestJointBudget(Problem(1, allow_offload_, allow_recompute_));
  if (!least.ok()) return out;  // not for a validated problem
  const int64_t smallest_units = *least;
  const double with_margin =
      static_cast<double>(smallest_units + outside_) / (1 - options_.margin);
  const int64_t smallest = static_cast<int64_t>(with_margin) + 1;
  if (refusal_.empty() && !has_plan_) {
    refusal_ = "actoffload: a budget of " + std::to_string(budget_) +
               " bytes cannot be kept (the step needs " +
               std::to_string(outside_) + " bytes beside the " +
               std::to_string(index_.size()) +
               " units and the head, and no keep/offload/recompute plan of "
               "them fits the rest); the smallest that fits is " +
               std::to_string(smallest) + " bytes, planned for that instead";
    budget_ = smallest;
  }
  if (has_plan_) {
    out.warning = "actoffload: the measured peak exceeds the budget of " +
                  std::to_string(budget_) +
                  " bytes and no plan of the units can lower it further; "
                  "planned for the smallest (" +
                  std::to_string(smallest) + " bytes)";
  }
  units_budget_ = smallest_units;
  plan = PlanFor(smallest_units, allow_offload_, allow_recompute_);
  if (plan.has_value() && !RanOutOfMemory(plan->choice)) {
    Apply(Made(*plan, smallest_units));
    out.applied = true;
  }
  return out;
}

// Checkpointing's own choice: the fewest first units recomputed that the
// model says fit, with nothing offloaded and, where allowed, with the rest
// planned jointly. Which units recompute changes what the backward holds
// beside a re-run, and the model knows only the bytes it measured. The
// first also for the units' budget without the margin: where the model's
// peak is exact, the margin alone can cost checkpointing a layer (GPT-2 at
// 0.8: three first layers measured 0.796, the model with the margin asked
// for four), and the race measures whether it fits.
void JointRace::AddFirstUnitsRecomputed(
    std::vector<RacePlan>* candidates) const {
  const int64_t loose =
      units_budget_ + static_cast<int64_t>(budget_ * options_.margin);
  for (auto [offload, budget] : {std::pair(false, units_budget_),
                                 std::pair(false, loose),
                                 std::pair(true, units_budget_)}) {
    if (offload && !allow_offload_) break;
    const JointProblem p = Problem(budget, offload, true);
    for (size_t r = 1; r <= index_.size(); ++r) {
      std::vector<bool> recompute(units_.size(), false);
      for (size_t i = 0; i < r; ++i) recompute[index_[i]] = true;
      StatusOr<JointPlan> plan = EvaluateJoint(p, recompute);
      if (!plan.ok()) continue;
      if (!ChoiceIn(*plan, *candidates)) {
        candidates->push_back(Made(*std::move(plan), budget));
      }
      break;
    }
  }
}

int64_t JointRace::Lowered(int64_t peak) const {
  return units_budget_ - (peak - budget_) -
         static_cast<int64_t>(budget_ * options_.margin);
}

std::optional<RacePlan> JointRace::LastResort() {
  if (last_resort_tried_ || !allow_recompute_) return std::nullopt;
  last_resort_tried_ = true;
  StatusOr<int64_t> least = SmallestJointBudget(Problem(1, false, true));
  if (!least.ok()) return std::nullopt;
  std::optional<JointPlan> plan = PlanFor(*least, false, true);
  if (!plan.has_value() || ChoiceIn(*plan, all_trials_) ||
      RanOutOfMemory(plan->choice)) {
    return std::nullopt;
  }
  return Made(*std::move(plan), *least);
}

int64_t JointRace::SmallestUnits() {
  if (!smallest_.has_value()) {
    StatusOr<int64_t> least =
        SmallestJointBudget(Problem(1, allow_offload_, allow_recompute_));
    smallest_ = least.ok() ? *least : std::numeric_limits<int64_t>::max();
  }
  return *smallest_;
}

void JointRace::Apply(const RacePlan& plan) {
  plan_ = plan;
  has_plan_ = true;
}

RacePlan JointRace::Made(JointPlan plan, int64_t budget) const {
  return {std::move(plan), budget, recompute_excess_, selective_excess_};
}

JointPlan JointRace::Predicted(const RacePlan& p) const {
  StatusOr<JointPlan> again =
      EvaluateJoint(Problem(p.budget, allow_offload_, allow_recompute_),
                    p.plan.choice);
  return again.ok() ? *std::move(again) : p.plan;
}

void JointRace::PruneCandidates() {
  const RaceTrial* best = FastestFitting(trials_, Allowed());
  if (best == nullptr) return;
  const double slowest = best->step_ns * (1 + options_.prune);
  while (!candidates_.empty() && Predicted(candidates_.front()).step_ns > slowest) {
    candidates_.erase(candidates_.begin());
  }
}

RaceStep JointRace::Measured(double step_ns, int64_t peak_bytes) {
  if (settled_) {  // a check of the kept plan
    --checks_left_;
    if (peak_bytes <= Allowed()) return {};
    const int64_t lowered = Lowered(peak_bytes);
    if (lowered >= SmallestUnits()) {
      settled_ = false;
      units_budget_ = lowered;
      return Replan();
    }
    // Over, and no plan of the units is smaller: the check's peak is the
    // kept plan's, and the plan measured lowest is kept (KeepLowest).
    for (RaceTrial& t : all_trials_) {
      if (SameChoice(t.plan.plan, plan_.plan)) {
        t.peak_bytes = std::max(t.peak_bytes, peak_bytes);
      }
    }
    RaceStep out;
    out.warning = KeepLowest();
    out.applied = true;
    return out;
  }
  runs_.push_back({step_ns, peak_bytes});
  if (rematching_) {
    if (static_cast<int>(runs_.size()) < options_.rematch_runs) return {};
    MergeRematchRuns();
    if (!rematch_.empty()) {
      Apply(rematch_.front());
      rematch_.erase(rematch_.begin());
      RaceStep out;
      out.applied = true;
      return out;
    }
    rematching_ = false;
    return KeepOrRaceOn();
  }
  if (static_cast<int>(runs_.size()) < options_.runs_per_candidate) {
    return {};  // a plan's first run allocates its pinned buffers: run it again
  }
  RaceTrial trial{std::numeric_limits<double>::infinity(), 0, plan_};
  for (size_t i = 1; i < runs_.size(); ++i) {
    trial.step_ns = std::min(trial.step_ns, runs_[i].first);
    trial.peak_bytes = std::max(trial.peak_bytes, runs_[i].second);
  }
  runs_.clear();
  trials_.push_back(trial);
  all_trials_.push_back(trial);
  if (options_.fit_excess) FitExcess();
  if (plan_.plan.offloaded_bytes > 0 && !calibrated_) {
    Calibrate(trial.step_ns, plan_.plan.choice);
  }
  RaceStep out;
  PruneCandidates();
  if (!candidates_.empty()) {
    Apply(candidates_.front());
    candidates_.erase(candidates_.begin());
    out.applied = true;
    return out;
  }
  return KeepOrRaceOn();
}

RaceStep JointRace::KeepOrRaceOn() {
  RaceStep out;
  if (const RaceTrial* best = Kept(trials_, Allowed(), options_.offload_tie)) {
    // A trial faster than it but over the budget: a plan made for that
    // trial's predicted peak less its excess may fit and stay faster. Race
    // again (at most options_.lowerings times), the trials that fit kept.
    const RaceTrial* faster = lowerings_left_ > 0
        ? FasterOver(trials_, *best, Allowed(), options_.worth_lowering)
        : nullptr;
    if (faster != nullptr) {
      const int64_t lowered =
          std::min(units_budget_, Predicted(faster->plan).peak_bytes) -
          (faster->peak_bytes - budget_) -
          static_cast<int64_t>(budget_ * options_.margin);
      if (lowered >= SmallestUnits()) {
        --lowerings_left_;
        return LowerAndReplan(lowered);
      }
    }
    if (StartRematch(*best)) {
      out.applied = true;
      return out;
    }
    Apply(best->plan);
    settled_ = true;
    checks_left_ = options_.checked_iterations;
    out.applied = true;
    return out;
  }
  // Every candidate is over: the units get the least excess less; where no
  // plan of the units fits that, the plan measured lowest is kept.
  const int64_t lowered = Lowered(Lowest(trials_).peak_bytes);
  if (lowered < SmallestUnits()) {
    if (std::optional<RacePlan> last = LastResort()) {
      candidates_.clear();
      Apply(*last);
      out.applied = true;
      return out;
    }
    out.warning = KeepLowest();
    out.applied = true;
    return out;
  }
  units_budget_ = lowered;
  return Replan();
}

bool JointRace::Measuring(int iteration) const {
  return iteration <= options_.warmup_iterations + 1 &&
         (!settled_ || checks_left_ > 0);
}

bool JointRace::WarmUpEnded(int iteration) {
  if (Measuring(iteration) || settled_ || all_trials_.empty()) return false;
  SettleOnBest();
  return true;
}

void JointRace::SettleOnBest() {
  const RaceTrial* best = Kept(all_trials_, Allowed(), options_.offload_tie);
  if (best == nullptr) {
    KeepLowest();
    return;
  }
  Apply(best->plan);
  settled_ = true;
  checks_left_ = 0;
}

std::string JointRace::KeepLowest() {
  const RaceTrial& lowest = Lowest(all_trials_);
  std::string warning;
  if (refusal_.empty()) {
    // SPEC 7.8: the caller's budget, which no plan keeps as measured, is
    // refused once, naming the smallest that fits as measured.
    refusal_ = "actoffload: a budget of " + std::to_string(budget_) +
               " bytes cannot be kept as measured (every plan the warm-up "
               "ran measured over it); the smallest that fits as measured is " +
               std::to_string(lowest.peak_bytes) +
               " bytes, planned for that instead";
  } else {
    // The budget is the smallest the model named after a refusal, not the
    // user's: told already, the caller hears it once more as a warning.
    warning = "actoffload: no plan keeps the budget of " +
              std::to_string(budget_) +
              " bytes as measured; keeping the one measured lowest (" +
              std::to_string(lowest.peak_bytes) +
              " bytes), the smallest that fits as measured";
  }
  budget_ = lowest.peak_bytes;
  Apply(lowest.plan);
  settled_ = true;
  checks_left_ = 0;
  return warning;
}

void JointRace::RaceJointPlanFirst() {
  std::optional<JointPlan> again =
      PlanFor(units_budget_, allow_offload_, allow_recompute_);
  if (again.has_value() && !ChoiceIn(*again, all_trials_) &&
      !ChoiceIn(*again, candidates_) && !RanOutOfMemory(again->choice)) {
    candidates_.insert(candidates_.begin(), Made(*again, units_budget_));
  }
}

}  // namespace offload
