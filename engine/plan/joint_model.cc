// The joint plan's model (engine/plan/joint_plan.h): the problem's checks and
// the prediction of one choice (EvaluateJoint).

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/plan/joint_model.h"
#include "engine/plan/joint_plan.h"

namespace offload {

using joint_internal::BackwardTransient;
using joint_internal::Bytes;
using joint_internal::ForwardBytes;
using joint_internal::ForwardTransient;
using joint_internal::HostBytes;
using joint_internal::IsSelective;
using joint_internal::RecreatedBytes;
using joint_internal::Releasable;
using joint_internal::ReRunNs;
using joint_internal::ReRuns;
using joint_internal::UnitName;

const char* UnitChoiceName(UnitChoice c) {
  switch (c) {
    case UnitChoice::kKeep:
      return "keep";
    case UnitChoice::kOffload:
      return "offload";
    case UnitChoice::kRecompute:
      return "recompute";
    case UnitChoice::kSelective:
      return "selective";
    case UnitChoice::kSelectiveOffload:
      return "selective-offload";
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
    if (u.recompute_forward_transient_bytes < 0) {
      return bad("recompute_forward_transient_bytes must not be negative, "
                 "got " + std::to_string(u.recompute_forward_transient_bytes));
    }
    if (u.selective_forward_transient_bytes < 0 ||
        u.selective_backward_transient_bytes < 0) {
      return bad("selective transients must not be negative, got " +
                 std::to_string(u.selective_forward_transient_bytes) +
                 " and " +
                 std::to_string(u.selective_backward_transient_bytes));
    }
    if (!(u.selective_ns >= 0) || !std::isfinite(u.selective_ns)) {
      return bad("selective_ns must be finite and not negative, got " +
                 std::to_string(u.selective_ns));
    }
    if (u.selective && !u.recomputable) {
      return bad("selective requires recomputable");
    }
    if (u.selective &&
        (u.selective_bytes <= 0 || u.selective_bytes > u.saved_bytes)) {
      return bad("selective_bytes " + std::to_string(u.selective_bytes) +
                 " must be positive and within saved_bytes " +
                 std::to_string(u.saved_bytes));
    }
    if (u.recomputable &&
        (u.input_bytes < 0 || u.input_bytes > u.saved_bytes)) {
      return bad("input_bytes " + std::to_string(u.input_bytes) +
                 " must be within saved_bytes " +
                 std::to_string(u.saved_bytes));
    }
    if (u.recomputable && u.recompute_bytes < 0) {
      return bad("recompute_bytes must not be negative, got " +
                 std::to_string(u.recompute_bytes));
    }
  }
  return OkStatus();
}

StatusOr<JointPlan> EvaluateJoint(const JointProblem& p,
                                  const std::vector<UnitChoice>& choice) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (static_cast<int>(choice.size()) != n) {
    return InvalidArgumentError("joint plan: " + std::to_string(choice.size()) +
                                " choices for " + std::to_string(n) + " units");
  }
  // rerun[i]: kRecompute, kSelective, kSelectiveOffload or (none) kKeep.
  std::vector<UnitChoice> rerun(n, UnitChoice::kKeep);
  std::vector<int64_t> need(n), host(n);
  for (int i = 0; i < n; ++i) {
    const UnitCost& u = p.units[i];
    if (choice[i] == UnitChoice::kRecompute &&
        (!u.recomputable || !p.allow_recompute)) {
      return InvalidArgumentError("joint plan, " + UnitName(i) +
                                  ": recomputed but " +
                                  (p.allow_recompute ? "not recomputable"
                                                     : "recompute not allowed"));
    }
    if (IsSelective(choice[i]) && (!u.selective || !p.allow_recompute)) {
      return InvalidArgumentError(
          "joint plan, " + UnitName(i) + ": selective but " +
          (p.allow_recompute ? "not selective" : "recompute not allowed"));
    }
    if (choice[i] == UnitChoice::kSelectiveOffload &&
        (!u.offloadable || !p.allow_offload)) {
      return InvalidArgumentError(
          "joint plan, " + UnitName(i) + ": selective-offload but " +
          (p.allow_offload ? "not offloadable" : "offload not allowed"));
    }
    if (ReRuns(choice[i])) rerun[i] = choice[i];
    need[i] = ForwardBytes(u, rerun[i]);
    host[i] = HostBytes(u, rerun[i]);
  }
  JointPlan plan;
  plan.choice = rerun;
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
    const int64_t own =  // unit i's at its peak
        need[i] + ForwardTransient(p.units[i], rerun[i]);
    while (resident + own > p.budget && p.allow_offload) {
      while (next_candidate < i &&
             (!Releasable(rerun[next_candidate]) || released[next_candidate] ||
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
      resident -= host[next_candidate];
    }
    if (resident + own > p.budget) {
      return exhausted("in the forward", i, resident);
    }
    plan.peak_bytes = std::max(plan.peak_bytes, resident + own);
    resident += need[i];
  }
  // Backward, memory. Slot s runs unit n-1-s; mem[s] is what is on device
  // while it runs, and mem[s] + extra[s] its peak: its backward's
  // temporaries or, when recomputed or selective, its re-run's transient if
  // larger (the re-run ends before the backward starts). Each released unit
  // comes back in the earliest slot from which its bytes fit beside every
  // peak up to its own backward.
  auto slot_of = [n](int unit) { return n - 1 - unit; };
  std::vector<int64_t> mem(n), extra(n);
  std::vector<int> reload_slot(n);
  auto place_backward = [&]() -> Status {
    mem.assign(n, 0);
    extra.assign(n, 0);
    reload_slot.assign(n, -1);
    for (int i = 0; i < n; ++i) {
      // Until its backward: all it saved, or what stays of a released one.
      const int64_t stays = released[i] ? need[i] - host[i] : need[i];
      for (int s = 0; s <= slot_of(i); ++s) mem[s] += stays;
      mem[slot_of(i)] += RecreatedBytes(p.units[i], rerun[i]);
      extra[slot_of(i)] = BackwardTransient(p.units[i], rerun[i]);
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
    int first_slot = 0;
    for (int u = n - 1; u >= 0; --u) {
      if (!released[u]) continue;
      const int64_t bytes = host[u];
      int slot = -1;
      for (int s = first_slot; s <= slot_of(u) && slot < 0; ++s) {
        int64_t most = 0;  // the highest peak it would sit next to
        for (int t = s; t <= slot_of(u); ++t) {
          most = std::max(most, mem[t] + extra[t]);
        }
        if (most + bytes <= p.budget) slot = s;
      }
      if (slot < 0) return exhausted("in the backward", u, mem[slot_of(u)]);
      for (int s = slot; s <= slot_of(u); ++s) mem[s] += bytes;
      reload_slot[u] = slot;
      first_slot = slot;
    }
    return OkStatus();
  };
  // The backward may need more room than the forward did (its temporaries,
  // a re-run beside kept units): the next units in forward order are
  // (but the last) released too, at the forward's end, until it fits. So a plan that fits
  // a budget also fits every larger one (fewer units are released for the
  // forward, and the same ones at most for the backward).
  for (Status fits = place_backward(); !fits.ok(); fits = place_backward()) {
    while (next_candidate < n - 1 &&
           (!Releasable(rerun[next_candidate]) || released[next_candidate] ||
            !p.units[next_candidate].offloadable)) {
      ++next_candidate;
    }
    if (!p.allow_offload || next_candidate >= n - 1) return fits;
    released[next_candidate] = true;
    release_during[n - 1].push_back({next_candidate, 1.0});
  }

  plan.released_during.assign(n, -1);
  plan.reloaded_during.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    for (const Release& r : release_during[i]) plan.released_during[r.unit] = i;
  }
  for (int i = 0; i < n; ++i) {
    if (released[i]) {
      plan.choice[i] = rerun[i] == UnitChoice::kSelectiveOffload
                           ? UnitChoice::kSelectiveOffload
                           : UnitChoice::kOffload;
      plan.offloaded_bytes += host[i];
    } else if (rerun[i] == UnitChoice::kSelectiveOffload) {
      plan.choice[i] = UnitChoice::kSelective;  // kept on device
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
                              double(host[i]) / p.d2h_gbps,
                          t);
      d2h_done[i] = d2h_free;
    }
  }

  for (int u = 0; u < n; ++u) {
    if (reload_slot[u] >= 0) plan.reloaded_during[u] = n - 1 - reload_slot[u];
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
                 double(host[v]) / p.h2d_gbps;
      reload_done[v] = h2d_free;
    }
    const int u = n - 1 - s;
    if (released[u] && reload_done[u] > t) {
      plan.stall_ns += reload_done[u] - t;
      t = reload_done[u];
    }
    t += p.units[u].backward_ns + ReRunNs(p.units[u], rerun[u]);
    if (rerun[u] == UnitChoice::kRecompute) {
      plan.recompute_ns += p.units[u].recompute_ns;
    } else if (IsSelective(rerun[u])) {
      plan.selective_ns += p.units[u].selective_ns;
    }
  }
  plan.step_ns = t;
  return plan;
}

StatusOr<JointPlan> EvaluateJoint(const JointProblem& p,
                                  const std::vector<bool>& recompute) {
  std::vector<UnitChoice> choice(recompute.size(), UnitChoice::kKeep);
  for (size_t i = 0; i < recompute.size(); ++i) {
    if (recompute[i]) choice[i] = UnitChoice::kRecompute;
  }
  return EvaluateJoint(p, choice);
}

}  // namespace offload
