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
  // fraction of its forward (its bytes arrive evenly while it runs).
  struct Release {
    int unit;
    double at;  // fraction of the forward of the unit it makes room for
  };
  std::vector<std::vector<Release>> release_during(n);
  std::vector<bool> released(n, false);
  int64_t resident = 0;
  int next_candidate = 0;
  for (int i = 0; i < n; ++i) {
    while (resident + need[i] > p.budget && p.allow_offload) {
      while (next_candidate < i &&
             (recompute[next_candidate] || released[next_candidate] ||
              !p.units[next_candidate].offloadable)) {
        ++next_candidate;
      }
      if (next_candidate >= i) break;
      const double at =
          need[i] > 0 ? double(std::max<int64_t>(0, p.budget - resident)) /
                            double(need[i])
                      : 0.0;
      released[next_candidate] = true;
      release_during[i].push_back({next_candidate, std::min(at, 1.0)});
      resident -= need[next_candidate];
    }
    if (resident + need[i] > p.budget) {
      return exhausted("in the forward", i, resident);
    }
    resident += need[i];
    plan.peak_bytes = std::max(plan.peak_bytes, resident);
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
  // while it runs.
  auto slot_of = [n](int unit) { return n - 1 - unit; };
  std::vector<int64_t> mem(n, 0);
  for (int i = 0; i < n; ++i) {
    if (!released[i]) {
      for (int s = 0; s <= slot_of(i); ++s) mem[s] += need[i];
    }
    if (recompute[i]) mem[slot_of(i)] += p.units[i].recompute_bytes;
  }
  for (int s = 0; s < n; ++s) {
    if (mem[s] > p.budget) {
      return ResourceExhaustedError(
          "joint plan: budget of " + Bytes(p.budget) + " is too small in the "
          "backward: while " + UnitName(n - 1 - s) + " runs, " + Bytes(mem[s]) +
          " are on device before any reload");
    }
  }
  std::vector<int> reload_slot(n, -1);
  int first_slot = 0;
  for (int u = n - 1; u >= 0; --u) {
    if (!released[u]) continue;
    const int64_t bytes = p.units[u].saved_bytes;
    int slot = -1;
    for (int s = first_slot; s <= slot_of(u) && slot < 0; ++s) {
      const int64_t most =
          *std::max_element(mem.begin() + s, mem.begin() + slot_of(u) + 1);
      if (most + bytes <= p.budget) slot = s;
    }
    if (slot < 0) {
      return exhausted("in the backward", u,
                       mem[slot_of(u)]);
    }
    for (int s = slot; s <= slot_of(u); ++s) mem[s] += bytes;
    reload_slot[u] = slot;
    first_slot = slot;
  }
  for (int64_t m : mem) plan.peak_bytes = std::max(plan.peak_bytes, m);

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
  std::vector<int> candidates;
  if (p.allow_recompute) {
    for (int i = 0; i < n; ++i) {
      if (p.units[i].recomputable) candidates.push_back(i);
    }
  }
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

StatusOr<int64_t> SmallestJointBudget(const JointProblem& problem) {
  JointProblem p = problem;
  int64_t high = 1;
  for (const UnitCost& u : p.units) high += u.saved_bytes;
  p.budget = high;
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  if (!PlanJoint(p).ok()) {
    // More than every saved byte: only a recompute's re-created bytes can
    // need it; grow until a plan fits.
    while (!PlanJoint(p).ok()) {
      if (p.budget > (int64_t{1} << 61)) {
        return InvalidArgumentError("joint plan: no budget fits");
      }
      p.budget *= 2;
    }
    high = p.budget;
  }
  int64_t low = 0;  // infeasible (budgets must be positive)
  while (high - low > 1) {
    p.budget = low + (high - low) / 2;
    if (PlanJoint(p).ok()) {
      high = p.budget;
    } else {
      low = p.budget;
    }
  }
  return high;
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
