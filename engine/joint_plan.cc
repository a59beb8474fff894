#include "engine/joint_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace offload {
namespace {

constexpr int kExhaustiveUnits = 16;

std::string UnitName(int unit) { return "unit " + std::to_string(unit); }

std::string Bytes(int64_t b) { return std::to_string(b) + " bytes"; }

int CountRecomputed(const std::vector<bool>& r) {
  return static_cast<int>(std::count(r.begin(), r.end(), true));
}

// Whether plan `a` is better than `b` (PlanJoint's order).
bool Better(const JointPlan& a, int a_recomputed, const JointPlan& b,
            int b_recomputed) {
  if (a.step_ns != b.step_ns) return a.step_ns < b.step_ns;
  if (a_recomputed != b_recomputed) return a_recomputed < b_recomputed;
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  return a.offloaded_bytes < b.offloaded_bytes;
}

// The units PlanJoint may recompute.
std::vector<int> RecomputeCandidates(const JointProblem& p) {
  std::vector<int> candidates;
  if (!p.allow_recompute) return candidates;
  for (int i = 0; i < static_cast<int>(p.units.size()); ++i) {
    if (p.units[i].recomputable) candidates.push_back(i);
  }
  return candidates;
}

}  // namespace

const char* UnitChoiceName(UnitChoice c) {
  switch (c) {
    case UnitChoice::kKeep:
      return "keep";
    case UnitChoice::kOffload:
      return "offload";
    case UnitChoice::kRecompute:
      return "recompute";
  }
  return "?";
}

Status ValidateJointProblem(const JointProblem& p) {
  if (p.units.empty()) return InvalidArgumentError("joint plan: no units");
  if (p.budget <= 0) {
    return InvalidArgumentError("joint plan: budget must be positive, got " +
                                std::to_string(p.budget));
  }
  if (p.allow_offload && !(p.d2h_gbps > 0 && p.h2d_gbps > 0)) {
    return InvalidArgumentError(
        "joint plan: offloading needs positive bandwidths, got d2h " +
        std::to_string(p.d2h_gbps) + " GB/s, h2d " +
        std::to_string(p.h2d_gbps) + " GB/s");
  }
  for (int i = 0; i < static_cast<int>(p.units.size()); ++i) {
    const UnitCost& u = p.units[i];
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("joint plan, " + UnitName(i) + ": " + why);
    };
    if (u.saved_bytes <= 0) return bad("saved_bytes must be positive");
    if (!(u.forward_ns >= 0) || !(u.backward_ns >= 0) ||
        !(u.recompute_ns >= 0) || !std::isfinite(u.forward_ns) ||
        !std::isfinite(u.backward_ns) || !std::isfinite(u.recompute_ns)) {
      return bad("times must be finite and not negative");
    }
    if (u.forward_transient_bytes < 0) {
      return bad("forward_transient_bytes must not be negative, got " +
                 std::to_string(u.forward_transient_bytes));
    }
    if (u.backward_transient_bytes < 0) {
      return bad("backward_transient_bytes must not be negative, got " +
                 std::to_string(u.backward_transient_bytes));
    }
    if (u.recomputable &&
        (u.input_bytes < 0 || u.input_bytes > u.saved_bytes ||
         u.recompute_bytes < 0 || u.recompute_bytes > u.saved_bytes)) {
      return bad("input_bytes " + std::to_string(u.input_bytes) +
                 " and recompute_bytes " + std::to_string(u.recompute_bytes) +
                 " must be within saved_bytes " +
                 std::to_string(u.saved_bytes));
    }
  }
  return OkStatus();
}

StatusOr<JointPlan> EvaluateJoint(const JointProblem& p,
                                  const std::vector<bool>& recompute) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (static_cast<int>(recompute.size()) != n) {
    return InvalidArgumentError("joint plan: " +
                                std::to_string(recompute.size()) +
                                " recompute choices for " + std::to_string(n) +
                                " units");
  }
  std::vector<int64_t> need(n);
  for (int i = 0; i < n; ++i) {
    if (recompute[i] && (!p.units[i].recomputable || !p.allow_recompute)) {
      return InvalidArgumentError("joint plan, " + UnitName(i) +
                                  ": recomputed but " +
                                  (p.allow_recompute ? "not recomputable"
                                                     : "recompute not allowed"));
    }
    need[i] = recompute[i] ? p.units[i].input_bytes : p.units[i].saved_bytes;
  }
  JointPlan plan;
  plan.choice.assign(n, UnitChoice::kKeep);
  for (int i = 0; i < n; ++i) {
    if (recompute[i]) plan.choice[i] = UnitChoice::kRecompute;
  }
  auto exhausted = [&](const std::string& where, int unit, int64_t held) {
    return ResourceExhaustedError(
        "joint plan: budget of " + Bytes(p.budget) + " is too small " + where +
        ": " + UnitName(unit) + " needs room while " + Bytes(held) +
        " stay on device");
  };

  // Forward, memory: which units are released during which, and at what
  // fraction of its forward (its saved and transient bytes arrive evenly
  // while it runs; the transient is gone by its end).
  struct Release {
    int unit;
    double at;  // fraction of the forward of the unit it makes room for
  };
  std::vector<std::vector<Release>> release_during(n);
  std::vector<bool> released(n, false);
  int64_t resident = 0;
  int next_candidate = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t transient = p.units[i].forward_transient_bytes;
    const int64_t own = need[i] + transient;  // unit i's at its peak
    while (resident + own > p.budget && p.allow_offload) {
      while (next_candidate < i &&
             (recompute[next_candidate] || released[next_candidate] ||
              !p.units[next_candidate].offloadable)) {
        ++next_candidate;
      }
      if (next_candidate >= i) break;
      const double at =
          own > 0 ? double(std::max<int64_t>(0, p.budget - resident)) /
                        double(own)
                  : 0.0;
      released[next_candidate] = true;
      release_during[i].push_back({next_candidate, std::min(at, 1.0)});
      resident -= need[next_candidate];
    }
    if (resident + own > p.budget) {
      return exhausted("in the forward", i, resident);
    }
    plan.peak_bytes = std::max(plan.peak_bytes, resident + own);
    resident += need[i];
  }
  plan.released_during.assign(n, -1);
  plan.reloaded_during.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    for (const Release& r : release_during[i]) plan.released_during[r.unit] = i;
  }
  for (int i = 0; i < n; ++i) {
    if (released[i]) {
      plan.choice[i] = UnitChoice::kOffload;
      plan.offloaded_bytes += p.units[i].saved_bytes;
    }
  }

  // Forward, time. A released unit's copy runs while it is produced: from
  // its forward's start (after the copies before it), ending no earlier
  // than its forward.
  double t = 0, d2h_free = 0;
  std::vector<double> d2h_done(n, 0);
  for (int i = 0; i < n; ++i) {
    const double start = t, forward = p.units[i].forward_ns;
    double done = 0;  // fraction of this forward behind us
    for (const Release& r : release_during[i]) {
      const double reach = t + (r.at - done) * forward;
      if (d2h_done[r.unit] > reach) {
        plan.stall_ns += d2h_done[r.unit] - reach;
        t = d2h_done[r.unit];
      } else {
        t = reach;
      }
      done = r.at;
    }
    t += (1.0 - done) * forward;
    if (released[i]) {
      d2h_free = std::max(std::max(d2h_free, start) +
                              double(p.units[i].saved_bytes) / p.d2h_gbps,
                          t);
      d2h_done[i] = d2h_free;
    }
  }

  // Backward, memory. Slot s runs unit n-1-s; mem[s] is what is on device
  // while it runs, and mem[s] + extra[s] its peak: its backward's
  // temporaries or, when recomputed, its re-run's transient if larger (the
  // re-run ends before the backward starts).
  auto slot_of = [n](int unit) { return n - 1 - unit; };
  std::vector<int64_t> mem(n, 0), extra(n, 0);
  for (int i = 0; i < n; ++i) {
    if (!released[i]) {
      for (int s = 0; s <= slot_of(i); ++s) mem[s] += need[i];
    }
    if (recompute[i]) mem[slot_of(i)] += p.units[i].recompute_bytes;
    extra[slot_of(i)] = std::max(
        p.units[i].backward_transient_bytes,
        recompute[i] ? p.units[i].forward_transient_bytes : int64_t{0});
  }
  for (int s = 0; s < n; ++s) {
    if (mem[s] + extra[s] > p.budget) {
      return ResourceExhaustedError(
          "joint plan: budget of " + Bytes(p.budget) + " is too small in the "
          "backward: while " + UnitName(n - 1 - s) + " runs, " +
          Bytes(mem[s] + extra[s]) + " are on device at its peak before "
          "any reload");
    }
  }
  std::vector<int> reload_slot(n, -1);
  int first_slot = 0;
  for (int u = n - 1; u >= 0; --u) {
    if (!released[u]) continue;
    const int64_t bytes = p.units[u].saved_bytes;
    int slot = -1;
    for (int s = first_slot; s <= slot_of(u) && slot < 0; ++s) {
      int64_t most = 0;  // the highest peak it would sit next to
      for (int t = s; t <= slot_of(u); ++t) {
        most = std::max(most, mem[t] + extra[t]);
      }
      if (most + bytes <= p.budget) slot = s;
    }
    if (slot < 0) {
      return exhausted("in the backward", u,
                       mem[slot_of(u)]);
    }
    for (int s = slot; s <= slot_of(u); ++s) mem[s] += bytes;
    reload_slot[u] = slot;
    plan.reloaded_during[u] = n - 1 - slot;
    first_slot = slot;
  }
  for (int s = 0; s < n; ++s) {
    plan.peak_bytes = std::max(plan.peak_bytes, mem[s] + extra[s]);
  }

  // Backward, time.
  double h2d_free = t;
  std::vector<double> reload_done(n, 0);
  for (int s = 0; s < n; ++s) {
    for (int v = n - 1; v >= 0; --v) {
      if (reload_slot[v] != s) continue;
      h2d_free = std::max({h2d_free, t, d2h_done[v]}) +
                 double(p.units[v].saved_bytes) / p.h2d_gbps;
      reload_done[v] = h2d_free;
    }
    const int u = n - 1 - s;
    if (released[u] && reload_done[u] > t) {
      plan.stall_ns += reload_done[u] - t;
      t = reload_done[u];
    }
    t += p.units[u].backward_ns;
    if (recompute[u]) {
      t += p.units[u].recompute_ns;
      plan.recompute_ns += p.units[u].recompute_ns;
    }
  }
  plan.step_ns = t;
  return plan;
}

StatusOr<JointPlan> PlanJoint(const JointProblem& p) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  const std::vector<int> candidates = RecomputeCandidates(p);
  const int c = static_cast<int>(candidates.size());
  bool found = false;
  JointPlan best;
  int best_recomputed = 0;
  auto consider = [&](const std::vector<bool>& r) -> bool {
    StatusOr<JointPlan> plan = EvaluateJoint(p, r);
    if (!plan.ok()) return false;
    const int k = CountRecomputed(r);
    if (!found || Better(*plan, k, best, best_recomputed)) {
      best = *plan;
      best_recomputed = k;
      found = true;
    }
    return true;
  };
  if (c <= kExhaustiveUnits) {
    for (uint32_t mask = 0; mask < (1u << c); ++mask) {
      std::vector<bool> r(n, false);
      for (int b = 0; b < c; ++b) r[candidates[b]] = (mask >> b) & 1u;
      consider(r);
    }
  } else {
    // Greedy: from no unit recomputed to all, add at each round the unit
    // that gives the least step (until some plan fits: the one that frees
    // the most bytes); the best plan seen on the way wins. Whole rounds, not
    // a stop at the first round that does not help: one recomputed unit may
    // free too little to spare a release, two may.
    std::vector<bool> r(n, false);
    consider(r);
    for (int round = 0; round < c; ++round) {
      int pick = -1, roomiest = -1;
      double pick_step = std::numeric_limits<double>::infinity();
      int64_t most_freed = -1;
      for (int i : candidates) {
        if (r[i]) continue;
        std::vector<bool> trial = r;
        trial[i] = true;
        StatusOr<JointPlan> plan = EvaluateJoint(p, trial);
        if (plan.ok()) {
          consider(trial);
          if (plan->step_ns < pick_step) {
            pick = i;
            pick_step = plan->step_ns;
          }
        }
        const int64_t freed = p.units[i].saved_bytes - p.units[i].input_bytes;
        if (freed > most_freed) {
          most_freed = freed;
          roomiest = i;
        }
      }
      r[pick >= 0 ? pick : roomiest] = true;
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
    most = std::max(most, (u.recomputable ? u.recompute_bytes : 0) +
                              std::max(u.forward_transient_bytes,
                                       u.backward_transient_bytes));
  }
  return std::max<int64_t>(1, total + most);
}

// The least budget below `below` at which EvaluateJoint(p, recompute)
// succeeds, or `below` if none does. The forward releases the first k of
// its candidates (units not recomputed that may be offloaded, in order),
// k the fewest for which every unit's forward fits: the budgets with k
// released form the interval [lowest[k], lowest[k-1]). Within one the
// backward holds the same units, so success is monotone there (a larger
// budget only lets reloads start earlier), and a binary search finds its
// least budget.
int64_t LeastBudgetFor(JointProblem p, const std::vector<bool>& recompute,
                       int64_t below) {
  const int n = static_cast<int>(p.units.size());
  std::vector<int64_t> first = {0};  // needs of the first k candidates
  std::vector<int> before(n);        // candidates among units 0..i-1
  for (int i = 0; i < n; ++i) {
    before[i] = static_cast<int>(first.size()) - 1;
    if (p.allow_offload && p.units[i].offloadable && !recompute[i]) {
      first.push_back(first.back() + p.units[i].saved_bytes);
    }
  }
  const int m = static_cast<int>(first.size()) - 1;
  // lowest[k]: the least budget whose forward releases at most k units.
  std::vector<int64_t> lowest(m + 1, 1);
  for (int k = 0; k <= m; ++k) {
    int64_t produced = 0;
    for (int i = 0; i < n; ++i) {
      const UnitCost& u = p.units[i];
      produced += recompute[i] ? u.input_bytes : u.saved_bytes;
      lowest[k] = std::max(lowest[k], produced + u.forward_transient_bytes -
                                          first[std::min(k, before[i])]);
    }
  }
  auto fits = [&](int64_t budget) {
    p.budget = budget;
    return EvaluateJoint(p, recompute).ok();
  };
  // From the lowest interval up: the first with a budget that fits holds
  // the least.
  for (int k = m; k >= 0 && lowest[k] < below; --k) {
    const int64_t top = std::min(k > 0 ? lowest[k - 1] : below, below) - 1;
    if (lowest[k] > top || !fits(top)) continue;
    return LeastFitting(lowest[k] - 1, top, fits);
  }
  return below;
}

}  // namespace

StatusOr<int64_t> SmallestJointBudget(const JointProblem& problem) {
  JointProblem p = problem;
  p.budget = RoomyBudget(p);  // fits: nothing recomputed, nothing released
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  const std::vector<int> candidates = RecomputeCandidates(p);
  const int c = static_cast<int>(candidates.size());
  if (c > kExhaustiveUnits) {
    return LeastFitting(0, p.budget, [&p](int64_t budget) {
      p.budget = budget;
      return PlanJoint(p).ok();
    });
  }
  // PlanJoint succeeds where any set it tries does: the least over them.
  int64_t least = p.budget;
  for (uint32_t mask = 0; mask < (1u << c); ++mask) {
    std::vector<bool> r(n, false);
    for (int b = 0; b < c; ++b) r[candidates[b]] = (mask >> b) & 1u;
    least = LeastBudgetFor(p, r, least);
  }
  return least;
}

Status ValidateJointPlan(const JointPlan& plan, const JointProblem& p) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (static_cast<int>(plan.choice.size()) != n) {
    return InvalidArgumentError("joint plan: sized for another problem");
  }
  std::vector<bool> r(n);
  for (int i = 0; i < n; ++i) r[i] = plan.Recompute(i);
  StatusOr<JointPlan> expected = EvaluateJoint(p, r);
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
  std::string out =
      "unit  saved_bytes  fwd_ms  bwd_ms  recompute_ms  choice\n";
  char line[200];
  for (size_t i = 0; i < p.units.size(); ++i) {
    const UnitCost& u = p.units[i];
    char rc[32] = "-";
    if (u.recomputable) std::snprintf(rc, sizeof(rc), "%.3f", u.recompute_ns / 1e6);
    std::snprintf(line, sizeof(line), "%4zu  %11lld  %6.3f  %6.3f  %12s  %s\n",
                  i, static_cast<long long>(u.saved_bytes), u.forward_ns / 1e6,
                  u.backward_ns / 1e6, rc,
                  i < plan.choice.size() ? UnitChoiceName(plan.choice[i]) : "?");
    out += line;
  }
  std::snprintf(line, sizeof(line),
                "predicted step %.3f ms (stalls %.3f ms, recompute %.3f ms); "
                "offloaded %lld bytes; peak %lld bytes, budget %lld\n",
                plan.step_ns / 1e6, plan.stall_ns / 1e6, plan.recompute_ns / 1e6,
                static_cast<long long>(plan.offloaded_bytes),
                static_cast<long long>(plan.peak_bytes),
                static_cast<long long>(p.budget));
  out += line;
  return out;
}

}  // namespace offload
