#include "engine/plan/budget_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace offload {
namespace {

std::string UnitName(const BudgetRecording& recording, int unit) {
  const BudgetUnit& u = recording.units[unit];
  return "unit " + std::to_string(unit) + " (layer " + std::to_string(u.layer) +
         ", pushes " + std::to_string(u.first_push) + ".." +
         std::to_string(u.last_push) + ", " + std::to_string(u.bytes) +
         " bytes)";
}

// Units in order of first use (ties by unit index) among those that are
// offloaded and popped.
std::vector<int> ReloadOrder(const BudgetRecording& recording,
                             const std::vector<bool>& offloaded) {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(recording.units.size()); ++i) {
    if (offloaded[i] && recording.units[i].first_use >= 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return recording.units[a].first_use < recording.units[b].first_use;
  });
  return order;
}

}  // namespace

int64_t BudgetPlan::OffloadedBytes(const BudgetRecording& recording) const {
  int64_t bytes = 0;
  for (size_t i = 0; i < offloaded.size(); ++i) {
    if (offloaded[i]) bytes += recording.units[i].bytes;
  }
  return bytes;
}

Status ValidateRecording(const BudgetRecording& r) {
  if (r.layers < 1 || r.forward_pushes < 0 || r.backward_calls < 0) {
    return InvalidArgumentError("budget recording: " +
                                std::to_string(r.layers) + " layers, " +
                                std::to_string(r.forward_pushes) +
                                " pushes, " + std::to_string(r.backward_calls) +
                                " backward calls");
  }
  if (!r.held_outside.empty() &&
      (static_cast<int>(r.held_outside.size()) != r.backward_calls ||
       *std::min_element(r.held_outside.begin(), r.held_outside.end()) < 0)) {
    return InvalidArgumentError(
        "budget recording: held_outside needs one non-negative value per "
        "backward call (" + std::to_string(r.backward_calls) + "), has " +
        std::to_string(r.held_outside.size()));
  }
  if (!r.forward_outside.empty() &&
      (static_cast<int>(r.forward_outside.size()) != r.forward_pushes ||
       *std::min_element(r.forward_outside.begin(), r.forward_outside.end()) <
           0)) {
    return InvalidArgumentError(
        "budget recording: forward_outside needs one non-negative value per "
        "forward push (" + std::to_string(r.forward_pushes) + "), has " +
        std::to_string(r.forward_outside.size()));
  }
  for (int i = 0; i < static_cast<int>(r.units.size()); ++i) {
    const BudgetUnit& u = r.units[i];
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("budget recording, " + UnitName(r, i) +
                                  ": " + why);
    };
    if (u.layer < 0 || u.layer >= r.layers) return bad("layer out of range");
    if (u.bytes <= 0) return bad("no bytes");
    if (u.first_push < 0 || u.last_push < u.first_push ||
        u.last_push >= r.forward_pushes) {
      return bad("pushes out of range");
    }
    // A unit's views are pushed by consecutive calls: units follow each
    // other (two may share a call: components of one composite).
    if (i > 0 && u.first_push < r.units[i - 1].last_push) {
      return bad("pushed before the previous unit's last push");
    }
    if (u.dropped_at <= u.last_push || u.dropped_at > r.forward_pushes) {
      return bad("dropped at push " + std::to_string(u.dropped_at) +
                 ", not after its last push and within the forward");
    }
    if (u.first_use < -1 || u.first_use >= r.backward_calls) {
      return bad("first use out of range");
    }
    for (int at : {u.free_at, u.done_at}) {
      if (at < 0 || at > r.backward_calls || at <= u.first_use) {
        return bad("freed at backward call " + std::to_string(at) +
                   ", not after its first use");
      }
    }
  }
  return OkStatus();
}

StatusOr<int64_t> SmallestBudget(const BudgetRecording& recording) {
  OFFLOAD_RETURN_IF_ERROR(ValidateRecording(recording));
  int64_t high = 1;
  for (const BudgetUnit& unit : recording.units) high += unit.bytes;
  int64_t held = 0;
  for (int64_t bytes : recording.held_outside) held = std::max(held, bytes);
  for (int64_t bytes : recording.forward_outside) held = std::max(held, bytes);
  high += held;
  int64_t low = 0;  // infeasible (budgets must be positive)
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (PlanBudget(recording, middle).ok()) {
      high = middle;
    } else {
      low = middle;
    }
  }
  return high;
}

StatusOr<BudgetPlan> PlanBudget(const BudgetRecording& r, int64_t budget) {
  if (budget <= 0) {
    return InvalidArgumentError("activation budget must be positive, got " +
                                std::to_string(budget));
  }
  OFFLOAD_RETURN_IF_ERROR(ValidateRecording(r));
  const int n = static_cast<int>(r.units.size());
  BudgetPlan plan;
  plan.budget = budget;
  plan.offloaded.assign(n, false);
  plan.release_at.assign(n, -1);
  plan.reload_at.assign(n, -1);
  auto too_small = [&](const std::string& where, int unit, int64_t held) {
    return ResourceExhaustedError(
        "activation budget of " + std::to_string(budget) + " bytes is too "
        "small " + where + ": " + UnitName(r, unit) + " needs room while " +
        std::to_string(held) + " bytes stay on device");
  };

  // Forward. `resident` counts units allocated and not released; the room
  // for the units first pushed at q is made at the end of push q - 1, by
  // releasing the earliest pushed units whose last push and drop came by
  // then.
  int64_t resident = 0;
  int next_unit = 0;   // the first unit not yet allocated
  int first_kept = 0;  // the first unit not released
  for (int q = 0; q < r.forward_pushes; ++q) {
    int64_t need = r.ForwardOutside(q);  // room next to the units resident
    int last = next_unit;
    while (last < n && r.units[last].first_push == q) need += r.units[last++].bytes;
    for (int i = first_kept; i < next_unit && resident + need > budget; ++i) {
      if (plan.offloaded[i] || r.units[i].last_push > q - 1 ||
          r.units[i].dropped_at > q - 1) {
        continue;
      }
      plan.offloaded[i] = true;
      plan.release_at[i] = q - 1;
      resident -= r.units[i].bytes;
    }
    if (resident + need > budget) {
      if (next_unit < last) {
        return too_small("in the forward", next_unit,
                         resident + r.ForwardOutside(q));
      }
      return ResourceExhaustedError(
          "activation budget of " + std::to_string(budget) + " bytes is too "
          "small in the forward: at push " + std::to_string(q) + ", " +
          std::to_string(r.ForwardOutside(q)) + " bytes outside the engine "
          "while " + std::to_string(resident) + " bytes of saved tensors stay "
          "on device");
    }
    while (first_kept < next_unit && plan.offloaded[first_kept]) ++first_kept;
    plan.peak_bytes = std::max(plan.peak_bytes, resident + need);
    resident += need - r.ForwardOutside(q);
    next_unit = last;
  }

  // Backward. committed[c]: the bytes on device during call c (after its
  // frees): units kept until they go, the bytes held outside, and the
  // reloads placed so far from their call until they go. Reloads are placed
  // in order of first use, each at the earliest call (not before the
  // previous one's) from which it fits next to committed until it goes.
  // Without bytes held outside this is "as soon as it fits at that call":
  // committed only falls after it. Where a reload fits nowhere because
  // kept units of its layer hold the room until the layer's end (a kept
  // unit stays until the next BackwardStep, a reloaded one only until
  // after its pop), the earliest pushed of them that would be gone by the
  // reload's first use goes to host too, released at the end of the
  // forward, and the backward is planned again: a larger budget, which
  // kept more in the forward, then never fails where a smaller one fit.
  const int calls = r.backward_calls;
  std::vector<int64_t> committed;
  for (;;) {
    committed.assign(calls, 0);
    for (int c = 0; c < calls; ++c) committed[c] = r.HeldOutside(c);
    for (int i = 0; i < n; ++i) {
      if (plan.offloaded[i]) continue;
      for (int c = 0; c < r.units[i].free_at && c < calls; ++c) {
        if (r.CountedAt(i, c)) committed[c] += r.units[i].bytes;
      }
    }
    // Bytes held outside at a backward call may need room the forward did
    // not make: with a probe's recording (forward_outside), units on device
    // then and first used later go to host too, earliest pushed first,
    // released at the end of the forward. (Without one, as before: such a
    // budget is refused.)
    const bool make_room = !r.forward_outside.empty();
    for (int c = 0; c < calls; ++c) {
      for (int i = 0; i < n && make_room && committed[c] > budget; ++i) {
        const BudgetUnit& u = r.units[i];
        if (plan.offloaded[i] || u.free_at <= c ||
            (u.first_use >= 0 && u.first_use <= c) ||
            u.dropped_at > r.forward_pushes - 1) {
          continue;
        }
        plan.offloaded[i] = true;
        plan.release_at[i] = r.forward_pushes - 1;
        for (int d = 0; d < u.free_at && d < calls; ++d) {
          if (r.CountedAt(i, d)) committed[d] -= u.bytes;
        }
      }
      if (committed[c] > budget) {
        return ResourceExhaustedError(
            "activation budget of " + std::to_string(budget) + " bytes is too "
            "small in the backward: at backward call " + std::to_string(c) +
            ", " + std::to_string(committed[c]) + " bytes are on device (" +
            std::to_string(r.HeldOutside(c)) + " of them held outside)");
      }
    }
    int first_call = 0;
    int stuck = -1;  // a unit whose reload fits nowhere
    for (int unit : ReloadOrder(r, plan.offloaded)) {
      const BudgetUnit& u = r.units[unit];
      const int until = std::max(u.first_use + 1, std::min(u.done_at, calls));
      int at = -1;
      for (int c = first_call; c <= u.first_use && at < 0; ++c) {
        int64_t most = 0;
        for (int d = c; d < until; ++d) {
          most = std::max(most,
                          committed[d] + (r.CountedAt(unit, d) ? u.bytes : 0));
        }
        if (most <= budget) at = c;
      }
      if (at < 0) {
        stuck = unit;
        break;
      }
      for (int c = at; c < until; ++c) {
        if (r.CountedAt(unit, c)) committed[c] += u.bytes;
      }
      plan.reload_at[unit] = at;
      first_call = at;
    }
    if (stuck < 0) break;
    const BudgetUnit& s = r.units[stuck];
    int kept = -1;
    for (int i = 0; i < n && kept < 0; ++i) {
      const BudgetUnit& u = r.units[i];
      if (!plan.offloaded[i] && u.first_use >= 0 && u.done_at <= s.first_use &&
          u.free_at > s.first_use && u.dropped_at <= r.forward_pushes - 1) {
        kept = i;
      }
    }
    if (kept < 0) {
      return too_small("in the backward", stuck, committed[s.first_use]);
    }
    plan.offloaded[kept] = true;
    plan.release_at[kept] = r.forward_pushes - 1;
    std::fill(plan.reload_at.begin(), plan.reload_at.end(), -1);
  }
  for (int64_t bytes : committed) {
    plan.peak_bytes = std::max(plan.peak_bytes, bytes);
  }
  OFFLOAD_RETURN_IF_ERROR(ValidateBudgetPlan(plan, r).WithContext(
      "internal: the planned budget schedule failed its check"));
  return plan;
}

Status ValidateBudgetPlan(const BudgetPlan& plan, const BudgetRecording& r) {
  OFFLOAD_RETURN_IF_ERROR(ValidateRecording(r));
  const size_t n = r.units.size();
  if (plan.offloaded.size() != n || plan.release_at.size() != n ||
      plan.reload_at.size() != n) {
    return InvalidArgumentError("budget plan: sized for another recording");
  }
  for (size_t i = 0; i < n; ++i) {
    const BudgetUnit& u = r.units[i];
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("budget plan, " + UnitName(r, int(i)) +
                                  ": " + why);
    };
    if (!plan.offloaded[i]) {
      if (plan.release_at[i] != -1 || plan.reload_at[i] != -1) {
        return bad("not offloaded but released or reloaded");
      }
      continue;
    }
    if (plan.release_at[i] < u.last_push ||
        plan.release_at[i] < u.dropped_at ||
        plan.release_at[i] >= r.forward_pushes) {
      return bad("released at push " + std::to_string(plan.release_at[i]) +
                 ", before its last push or its drop, or after the forward");
    }
    if (u.first_use < 0 ? plan.reload_at[i] != -1
                        : plan.reload_at[i] < 0 ||
                              plan.reload_at[i] > u.first_use) {
      return bad("reloaded at backward call " +
                 std::to_string(plan.reload_at[i]) + ", first used at " +
                 std::to_string(u.first_use));
    }
  }
  // Replay the calls and count the bytes on device.
  int64_t resident = 0, peak = 0;
  std::vector<bool> on_device(n, false);
  auto over = [&](const std::string& where) {
    return InvalidArgumentError("budget plan: " + std::to_string(resident) +
                                " bytes on device " + where + ", budget " +
                                std::to_string(plan.budget));
  };
  for (int q = 0; q < r.forward_pushes; ++q) {
    for (size_t i = 0; i < n; ++i) {
      if (r.units[i].first_push == q) {
        on_device[i] = true;
        resident += r.units[i].bytes;
      }
    }
    resident += r.ForwardOutside(q);
    peak = std::max(peak, resident);
    if (resident > plan.budget) {
      return over("at push " + std::to_string(q) + " (" +
                  std::to_string(r.ForwardOutside(q)) + " outside the engine)");
    }
    resident -= r.ForwardOutside(q);
    for (size_t i = 0; i < n; ++i) {
      if (plan.release_at[i] == q) {
        on_device[i] = false;
        resident -= r.units[i].bytes;
      }
    }
  }
  for (int c = 0; c < r.backward_calls; ++c) {
    for (size_t i = 0; i < n; ++i) {
      const int free_at =
          plan.offloaded[i] ? r.units[i].done_at : r.units[i].free_at;
      if (free_at == c && on_device[i]) {
        on_device[i] = false;
        resident -= r.units[i].bytes;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (plan.reload_at[i] == c) {
        on_device[i] = true;
        resident += r.units[i].bytes;
      }
    }
    int64_t uncounted = 0;  // in held_outside (outside_counts_drops)
    for (size_t i = 0; i < n; ++i) {
      if (on_device[i] && !r.CountedAt(int(i), c)) uncounted += r.units[i].bytes;
    }
    resident += r.HeldOutside(c) - uncounted;
    peak = std::max(peak, resident);
    if (resident > plan.budget) {
      return over("at backward call " + std::to_string(c) + " (" +
                  std::to_string(r.HeldOutside(c)) + " held outside)");
    }
    resident -= r.HeldOutside(c) - uncounted;
  }
  if (peak != plan.peak_bytes) {
    return InvalidArgumentError("budget plan: peak " +
                                std::to_string(plan.peak_bytes) +
                                " bytes claimed, " + std::to_string(peak) +
                                " replayed");
  }
  return OkStatus();
}

std::string FormatBudgetPlan(const BudgetPlan& plan,
                             const BudgetRecording& r) {
  std::string out =
      "unit  layer        bytes  offloaded  released@push  reload@bwd_call\n";
  char line[160];
  for (size_t i = 0; i < r.units.size(); ++i) {
    const BudgetUnit& u = r.units[i];
    std::snprintf(line, sizeof(line), "%4zu  %5d  %11lld  %9s  %13d  %15d\n",
                  i, u.layer, static_cast<long long>(u.bytes),
                  plan.offloaded[i] ? "yes" : "no", plan.release_at[i],
                  plan.reload_at[i]);
    out += line;
  }
  int64_t total = 0;
  for (const BudgetUnit& u : r.units) total += u.bytes;
  std::snprintf(line, sizeof(line),
                "offloaded %lld of %lld bytes; peak on device %lld bytes, "
                "budget %lld\n",
                static_cast<long long>(plan.OffloadedBytes(r)),
                static_cast<long long>(total),
                static_cast<long long>(plan.peak_bytes),
                static_cast<long long>(plan.budget));
  out += line;
  if (!r.forward_outside.empty() || !r.held_outside.empty()) {
    out += "outside the engine, per push:";
    for (int64_t bytes : r.forward_outside) out += " " + std::to_string(bytes);
    out += "\noutside the engine, per backward call:";
    for (int64_t bytes : r.held_outside) out += " " + std::to_string(bytes);
    out += "\n";
  }
  return out;
}

}  // namespace offload
