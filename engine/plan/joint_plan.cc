// The joint plan's searches (engine/plan/joint_plan.h): PlanJoint,
// SmallestJointBudget, and the plan's checks and table. The model's
// prediction of one choice is in joint_model.cc.

#include "engine/plan/joint_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/plan/joint_model.h"

namespace offload {
namespace {

using joint_internal::Bytes;
using joint_internal::ForwardBytes;
using joint_internal::ReRuns;
using joint_internal::UnitName;

// Re-run units (recomputed or selective), and fully recomputed ones.
struct ReRunCount {
  int units = 0;
  int full = 0;
};

ReRunCount CountReRuns(const std::vector<UnitChoice>& c) {
  ReRunCount count;
  for (UnitChoice x : c) {
    count.units += ReRuns(x);
    count.full += x == UnitChoice::kRecompute;
  }
  return count;
}

// Whether plan `a` is better than `b` (PlanJoint's order).
bool Better(const JointPlan& a, ReRunCount a_count, const JointPlan& b,
            ReRunCount b_count) {
  if (a.step_ns != b.step_ns) return a.step_ns < b.step_ns;
  if (a_count.units != b_count.units) return a_count.units < b_count.units;
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  if (a.offloaded_bytes != b.offloaded_bytes) {
    return a.offloaded_bytes < b.offloaded_bytes;
  }
  return a_count.full < b_count.full;
}

// What PlanJoint may choose per recomputable unit: none (kKeep: kept or
// offloaded by the forward rule), kRecompute, and kSelective where the unit
// allows it, kSelectiveOffload too where it may also be offloaded. Each
// assignment is one of those per candidate.
class Assignments {
 public:
  explicit Assignments(const JointProblem& p) : n_(p.units.size()) {
    if (!p.allow_recompute) return;
    for (int i = 0; i < static_cast<int>(p.units.size()); ++i) {
      if (!p.units[i].recomputable) continue;
      candidates_.push_back(i);
      kinds_.push_back({UnitChoice::kKeep, UnitChoice::kRecompute});
      if (p.units[i].selective) kinds_.back().push_back(UnitChoice::kSelective);
      if (p.units[i].selective && p.units[i].offloadable && p.allow_offload) {
        kinds_.back().push_back(UnitChoice::kSelectiveOffload);
      }
      if (count_ <= kJointExhaustiveAssignments) {
        count_ *= static_cast<int64_t>(kinds_.back().size());
      }
    }
  }

  // Whether there are at most kJointExhaustiveAssignments.
  bool Few() const { return count_ <= kJointExhaustiveAssignments; }

  // Calls fn(choice) for each assignment; candidate 0 is the fastest
  // digit (without selective units: the bit masks 0 .. 2^c - 1).
  // REQUIRES: Few().
  template <typename Fn>
  void ForEach(const Fn& fn) const {
    const int c = static_cast<int>(candidates_.size());
    std::vector<int> digit(c, 0);
    std::vector<UnitChoice> choice(n_, UnitChoice::kKeep);
    for (int64_t k = 0; k < count_; ++k) {
      fn(choice);
      for (int b = 0; b < c; ++b) {  // the next one: count up
        digit[b] = (digit[b] + 1) % static_cast<int>(kinds_[b].size());
        choice[candidates_[b]] = kinds_[b][digit[b]];
        if (digit[b] != 0) break;
      }
    }
  }

  const std::vector<int>& candidates() const { return candidates_; }
  // The re-run kinds (kRecompute, maybe the selective ones) of candidate b.
  std::vector<UnitChoice> ReRunKinds(int b) const {
    return {kinds_[b].begin() + 1, kinds_[b].end()};
  }

 private:
  size_t n_;
  std::vector<int> candidates_;
  std::vector<std::vector<UnitChoice>> kinds_;
  int64_t count_ = 1;  // stops growing past the exhaustive limit
};

}  // namespace

StatusOr<JointPlan> PlanJoint(const JointProblem& p) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  const Assignments assignments(p);
  const std::vector<int>& candidates = assignments.candidates();
  const int c = static_cast<int>(candidates.size());
  bool found = false;
  JointPlan best;
  ReRunCount best_count;
  auto consider = [&](const std::vector<UnitChoice>& r) -> bool {
    StatusOr<JointPlan> plan = EvaluateJoint(p, r);
    if (!plan.ok()) return false;
    const ReRunCount count = CountReRuns(r);
    if (!found || Better(*plan, count, best, best_count)) {
      best = *std::move(plan);
      best_count = count;
      found = true;
    }
    return true;
  };
  if (assignments.Few()) {
    assignments.ForEach(consider);
  } else {
    // Greedy: from no unit re-run to all, add at each round the unit and
    // kind (full or selective) that gives the least step (until some plan
    // fits: the one that frees the most bytes); the best plan seen on the
    // way wins. Whole rounds, not a stop at the first round that does not
    // help: one recomputed unit may free too little to spare a release,
    // two may.
    std::vector<UnitChoice> r(n, UnitChoice::kKeep);
    consider(r);
    // Every unit re-run in full, and selectively where it may: the greedy
    // rounds' last set mixes the kinds.
    std::vector<UnitChoice> all_full = r, all_selective = r;
    for (int i : candidates) {
      all_full[i] = UnitChoice::kRecompute;
      all_selective[i] =
          p.units[i].selective ? UnitChoice::kSelective : UnitChoice::kRecompute;
    }
    consider(all_full);
    consider(all_selective);
    for (int round = 0; round < c; ++round) {
      int pick = -1, roomiest = -1;
      UnitChoice pick_kind = UnitChoice::kKeep, roomiest_kind = pick_kind;
      double pick_step = std::numeric_limits<double>::infinity();
      int64_t most_freed = -1;
      for (int b = 0; b < c; ++b) {
        const int i = candidates[b];
        if (ReRuns(r[i])) continue;
        for (UnitChoice kind : assignments.ReRunKinds(b)) {
          std::vector<UnitChoice> trial = r;
          trial[i] = kind;
          StatusOr<JointPlan> plan = EvaluateJoint(p, trial);
          if (plan.ok()) {
            consider(trial);
            if (plan->step_ns < pick_step) {
              pick = i;
              pick_kind = kind;
              pick_step = plan->step_ns;
            }
          }
          const int64_t freed =
              p.units[i].saved_bytes - ForwardBytes(p.units[i], kind);
          if (freed > most_freed) {
            most_freed = freed;
            roomiest = i;
            roomiest_kind = kind;
          }
        }
      }
      if (pick >= 0) {
        r[pick] = pick_kind;
      } else {
        r[roomiest] = roomiest_kind;
      }
    }
    // Until a plan fits, the rounds add the roomiest kind, often a full
    // re-run; then the best plan's full re-runs become selective ones, one
    // at a time, while that makes it better.
    for (bool improved = found; improved;) {
      improved = false;
      std::vector<UnitChoice> base(n, UnitChoice::kKeep);
      for (int i = 0; i < n; ++i) {
        if (ReRuns(best.choice[i])) base[i] = best.choice[i];
      }
      for (int i : candidates) {
        if (base[i] != UnitChoice::kRecompute || !p.units[i].selective) continue;
        std::vector<UnitChoice> trial = base;
        trial[i] = UnitChoice::kSelective;
        const JointPlan before = best;
        consider(trial);
        if (best.choice != before.choice) {
          improved = true;
          break;
        }
      }
    }
  }
  if (!found) {
    std::vector<bool> all(n, false);
    for (int i : candidates) all[i] = true;
    return EvaluateJoint(p, all).status().WithContext(
        "no plan fits the budget, not even with every allowed unit "
        "recomputed");
  }
  return best;
}

namespace {

// The least budget in (low, high] that fits, where `high` fits and whether
// one fits is monotone in between: a binary search.
template <typename Fits>
int64_t LeastFitting(int64_t low, int64_t high, const Fits& fits) {
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    if (fits(mid)) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return high;
}

// A budget that every set of recomputed units fits with nothing released:
// all saved bytes and the most any one unit holds beyond them.
int64_t RoomyBudget(const JointProblem& p) {
  int64_t total = 0, most = 0;
  for (const UnitCost& u : p.units) {
    total += u.saved_bytes;
    const int64_t recreated =
        std::max(u.recomputable ? u.recompute_bytes : 0,
                 u.selective ? u.saved_bytes - u.selective_bytes : 0);
    most = std::max(
        most, recreated + std::max({u.forward_transient_bytes,
                                    u.backward_transient_bytes,
                                    u.recompute_forward_transient_bytes,
                                    u.selective_forward_transient_bytes,
                                    u.selective_backward_transient_bytes}));
  }
  return std::max<int64_t>(1, total + most);
}

// The least budget below `below` at which EvaluateJoint(p, choice)
// succeeds, or `below` if none does. Success is monotone in the budget (a
// larger one releases a prefix of the same units at most, the backward's
// releases included), so a binary search finds it.
int64_t LeastBudgetFor(JointProblem p, const std::vector<UnitChoice>& choice,
                       int64_t below) {
  auto fits = [&](int64_t budget) {
    p.budget = budget;
    return EvaluateJoint(p, choice).ok();
  };
  if (below <= 1 || !fits(below - 1)) return below;
  return LeastFitting(0, below - 1, fits);
}

}  // namespace

StatusOr<int64_t> SmallestJointBudget(const JointProblem& problem) {
  JointProblem p = problem;
  p.budget = RoomyBudget(p);  // fits: nothing recomputed, nothing released
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const Assignments assignments(p);
  if (!assignments.Few()) {
    return LeastFitting(0, p.budget, [&p](int64_t budget) {
      p.budget = budget;
      return PlanJoint(p).ok();
    });
  }
  // PlanJoint succeeds where any assignment it tries does: the least over
  // them.
  int64_t least = p.budget;
  assignments.ForEach([&](const std::vector<UnitChoice>& choice) {
    least = LeastBudgetFor(p, choice, least);
  });
  return least;
}

Status ValidateJointPlan(const JointPlan& plan, const JointProblem& p) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (static_cast<int>(plan.choice.size()) != n) {
    return InvalidArgumentError("joint plan: sized for another problem");
  }
  std::vector<UnitChoice> rerun(n, UnitChoice::kKeep);
  for (int i = 0; i < n; ++i) {
    if (ReRuns(plan.choice[i])) rerun[i] = plan.choice[i];
  }
  StatusOr<JointPlan> expected = EvaluateJoint(p, rerun);
  if (!expected.ok()) {
    return InvalidArgumentError("joint plan does not fit: " +
                                expected.status().message());
  }
  for (int i = 0; i < n; ++i) {
    if (plan.choice[i] != expected->choice[i]) {
      return InvalidArgumentError(
          "joint plan, " + UnitName(i) + ": " +
          UnitChoiceName(plan.choice[i]) + ", but the budget makes it " +
          UnitChoiceName(expected->choice[i]));
    }
  }
  auto near = [](double a, double b) {
    return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
  };
  if (!near(plan.step_ns, expected->step_ns) ||
      !near(plan.stall_ns, expected->stall_ns) ||
      !near(plan.recompute_ns, expected->recompute_ns) ||
      !near(plan.selective_ns, expected->selective_ns) ||
      plan.peak_bytes != expected->peak_bytes ||
      plan.offloaded_bytes != expected->offloaded_bytes) {
    return InvalidArgumentError(
        "joint plan: figures (step " + std::to_string(plan.step_ns) +
        " ns, peak " + Bytes(plan.peak_bytes) + ") differ from the model's (" +
        std::to_string(expected->step_ns) + " ns, " +
        Bytes(expected->peak_bytes) + ")");
  }
  return OkStatus();
}

std::string FormatJointPlan(const JointPlan& plan, const JointProblem& p) {
  // The selective columns only where a unit may be selective: other
  // tables read as before.
  const bool selective = std::any_of(p.units.begin(), p.units.end(),
                                     [](const UnitCost& u) { return u.selective; });
  std::string out = selective ? "unit  saved_bytes  fwd_ms  bwd_ms  "
                                "recompute_ms  selective_ms  choice\n"
                              : "unit  saved_bytes  fwd_ms  bwd_ms  "
                                "recompute_ms  choice\n";
  char line[240];
  for (size_t i = 0; i < p.units.size(); ++i) {
    const UnitCost& u = p.units[i];
    char rc[32] = "-";
    if (u.recomputable) std::snprintf(rc, sizeof(rc), "%.3f", u.recompute_ns / 1e6);
    char sel[48] = "";
    if (selective) {
      char ms[32] = "-";
      if (u.selective) std::snprintf(ms, sizeof(ms), "%.3f", u.selective_ns / 1e6);
      std::snprintf(sel, sizeof(sel), "%12s  ", ms);
    }
    std::snprintf(line, sizeof(line), "%4zu  %11lld  %6.3f  %6.3f  %12s  %s%s\n",
                  i, static_cast<long long>(u.saved_bytes), u.forward_ns / 1e6,
                  u.backward_ns / 1e6, rc, sel,
                  i < plan.choice.size() ? UnitChoiceName(plan.choice[i]) : "?");
    out += line;
  }
  char rerun[64];
  std::snprintf(rerun, sizeof(rerun), "recompute %.3f ms", plan.recompute_ns / 1e6);
  if (selective) {
    const size_t used = std::strlen(rerun);
    std::snprintf(rerun + used, sizeof(rerun) - used, ", selective %.3f ms",
                  plan.selective_ns / 1e6);
  }
  std::snprintf(line, sizeof(line),
                "predicted step %.3f ms (stalls %.3f ms, %s); "
                "offloaded %lld bytes; peak %lld bytes, budget %lld\n",
                plan.step_ns / 1e6, plan.stall_ns / 1e6, rerun,
                static_cast<long long>(plan.offloaded_bytes),
                static_cast<long long>(plan.peak_bytes),
                static_cast<long long>(p.budget));
  out += line;
  return out;
}

}  // namespace offload
