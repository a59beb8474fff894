#include "engine/plan/joint_limit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/joint_model.h"

namespace offload {
namespace {

using joint_internal::BackwardTransient;
using joint_internal::ForwardBytes;
using joint_internal::ForwardTransient;
using joint_internal::HostBytes;
using joint_internal::RecreatedBytes;
using joint_internal::ReRunNs;
using joint_internal::ReRuns;

std::string Bytes(int64_t b) { return std::to_string(b) + " bytes"; }

constexpr UnitChoice kChoices[] = {
    UnitChoice::kKeep, UnitChoice::kOffload, UnitChoice::kRecompute,
    UnitChoice::kSelective, UnitChoice::kSelectiveOffload};

bool Allowed(const JointProblem& p, int unit, UnitChoice c) {
  switch (c) {
    case UnitChoice::kKeep:
      return true;
    case UnitChoice::kOffload:
      return p.allow_offload && p.units[unit].offloadable;
    case UnitChoice::kRecompute:
      return p.allow_recompute && p.units[unit].recomputable;
    case UnitChoice::kSelective:
      return p.allow_recompute && p.units[unit].recomputable &&
             p.units[unit].selective;
    case UnitChoice::kSelectiveOffload:
      return p.allow_recompute && p.units[unit].recomputable &&
             p.units[unit].selective && p.allow_offload &&
             p.units[unit].offloadable;
  }
  return false;
}

// The bytes it sends to host under `c`: none unless offloaded.
int64_t OutBytes(const UnitCost& u, UnitChoice c) {
  const bool out =
      c == UnitChoice::kOffload || c == UnitChoice::kSelectiveOffload;
  return out ? HostBytes(u, c) : 0;
}

// What its backward needs whole: what it saved in the forward and what
// its re-run re-creates (selective: selective_bytes and the rest).
int64_t WholeBytes(const UnitCost& u, UnitChoice c) {
  return ForwardBytes(u, c) + RecreatedBytes(u, c);
}

// Where a choice does not fit: the unit, the bytes it needs on device at
// that boundary, and whether in the forward.
struct Misfit {
  int unit = -1;
  int64_t bytes = 0;
  bool forward = false;
};

// The bound of joint_limit.h for one choice, built unit by unit in forward
// order so that a search can share a prefix. Arrays are shifted by one:
// index i+1 is unit i, index 0 the time before unit 0 (F_-1 = 0, P_-1 = 0).
class Bounder {
 public:
  explicit Bounder(const JointProblem& p)
      : p_(p),
        n_(static_cast<int>(p.units.size())),
        choice_(n_, UnitChoice::kKeep),
        held_(n_ + 1, 0),
        out_(n_ + 1, 0),
        end_(n_ + 1, 0.0),
        room_(n_ + 1, 0),
        backward_end_(n_ + 1, 0.0) {}

  // Sets unit i's choice and computes F_i from F_-1..F_i-1 (units 0..i-1
  // must be set). Returns false, with *misfit set, when the bytes of units
  // 0..i that cannot leave the device, with unit i's forward transient,
  // exceed the budget at F_i.
  bool Forward(int i, UnitChoice c, Misfit* misfit) {
    const UnitCost& u = p_.units[i];
    choice_[i] = c;
    held_[i + 1] = held_[i] + ForwardBytes(u, c);
    out_[i + 1] = out_[i] + OutBytes(u, c);
    // Bytes that must be out by F_i: what exceeds the budget at unit i's
    // peak (all its bytes and its transient).
    const int64_t peak = held_[i + 1] + ForwardTransient(u, c);
    const int64_t excess = peak - p_.budget;
    if (excess > out_[i + 1]) {
      *misfit = {i, peak - out_[i + 1], true};
      return false;
    }
    double f = end_[i] + u.forward_ns;
    // By F_i at most P_k + d2h * (F_i - F_k) bytes are out (k = -1..i-1).
    // excess > out_[k] >= 0 implies an offloaded unit, so d2h_gbps > 0.
    for (int k = 0; k <= i; ++k) {
      if (excess > out_[k]) {
        f = std::max(f, end_[k] + double(excess - out_[k]) / p_.d2h_gbps);
      }
    }
    end_[i + 1] = f;
    return true;
  }

  // F_i. REQUIRES: Forward(i, ...) returned true.
  double ForwardEnd(int i) const { return end_[i + 1]; }

  // The bound (E_0), once every unit's Forward returned true. Returns false,
  // with *misfit set, when some unit's backward cannot hold what it needs.
  bool Backward(double* step, Misfit* misfit) {
    // Room left by w's backward for reloads of units below w; room_[n] is
    // what the forward's end leaves (>= 0 once the forward fits).
    room_[n_] = p_.budget - (held_[n_] - out_[n_]);
    for (int w = n_ - 1; w >= 0; --w) {
      const UnitCost& u = p_.units[w];
      const int64_t whole = WholeBytes(u, choice_[w]);
      const int64_t transient = BackwardTransient(u, choice_[w]);
      const int64_t needed = (held_[w] - out_[w]) + whole + transient;
      room_[w] = p_.budget - needed;
      if (room_[w] < 0) {
        *misfit = {w, needed, false};
        return false;
      }
    }
    const double both = std::min(p_.d2h_gbps, p_.h2d_gbps);
    backward_end_[n_] = end_[n_];
    for (int u = n_ - 1; u >= 0; --u) {
      double start = backward_end_[u + 1];
      // Units u..n-1's offloaded bytes: out and back by S_u, none before
      // F_u-1 (end_[u]).
      const int64_t tail = out_[n_] - out_[u];
      if (tail > 0) start = std::max(start, end_[u] + double(tail) / both);
      // Those of units u..w-1 beyond the room at E_w come back after E_w.
      for (int w = u + 1; w <= n_; ++w) {
        const int64_t over = (out_[w] - out_[u]) - room_[w];
        if (over > 0) {
          start = std::max(start, backward_end_[w] + double(over) / p_.h2d_gbps);
        }
      }
      const UnitCost& unit = p_.units[u];
      const double run = unit.backward_ns + ReRunNs(unit, choice_[u]);
      // What u's backward holds beyond the budget, were every offloaded
      // byte of units below it on device, is off device by E_u: at most
      // P_k + d2h * (E_u - F_k) of it is out, k = -1..u-2 (units k+1..u-1
      // make theirs after F_k; here out_[k] is P_k-1, end_[k] F_k-1).
      const int64_t excess = out_[u] - room_[u];
      for (int k = 0; k < u; ++k) {
        if (excess > out_[k]) {
          start = std::max(start, end_[k] + double(excess - out_[k]) / p_.d2h_gbps - run);
        }
      }
      backward_end_[u] = start + run;
    }
    *step = backward_end_[0];
    return true;
  }

 private:
  const JointProblem& p_;
  const int n_;
  std::vector<UnitChoice> choice_;
  std::vector<int64_t> held_;  // bytes of units 0..i kept until their backward
  std::vector<int64_t> out_;   // P_i: offloaded bytes of units 0..i
  std::vector<double> end_;    // F_i
  std::vector<int64_t> room_;  // per backward w (n: the forward's end)
  std::vector<double> backward_end_;  // E_u (n: F_n-1)
};

Status MisfitError(const JointProblem& p, const Misfit& m) {
  const std::string where =
      m.forward ? "at the end of unit " + std::to_string(m.unit) +
                      "'s forward, " + Bytes(m.bytes) +
                      " of units 0.." + std::to_string(m.unit) +
                      " cannot leave the device"
                : "during unit " + std::to_string(m.unit) + "'s backward, " +
                      Bytes(m.bytes) + " must be on device";
  return ResourceExhaustedError("joint limit: budget of " + Bytes(p.budget) +
                                " is too small: " + where);
}

double ComputeNs(const JointProblem& p, const std::vector<UnitChoice>& c) {
  double total = 0;
  for (size_t i = 0; i < p.units.size(); ++i) {
    total += p.units[i].forward_ns + p.units[i].backward_ns;
    total += ReRunNs(p.units[i], c[i]);
  }
  return total;
}

bool Near(double a, double b) {
  return std::fabs(a - b) <= 1e-12 * std::max(1.0, std::fabs(b));
}

// Depth-first search over choices in forward order (branch and bound).
class Search {
 public:
  explicit Search(const JointProblem& p)
      : p_(p),
        n_(static_cast<int>(p.units.size())),
        bounder_(p),
        choice_(n_, UnitChoice::kKeep),
        rest_forward_(n_ + 1, 0.0) {
    for (int i = n_ - 1; i >= 0; --i) {
      rest_forward_[i] = rest_forward_[i + 1] + p.units[i].forward_ns;
      all_backward_ += p.units[i].backward_ns;
    }
  }

  void Run() { Visit(0, 0, 0, 0.0); }
  bool found() const { return found_; }
  JointLimitResult result() const { return best_; }

 private:
  void Visit(int i, int recomputed, int64_t offloaded, double recompute_ns) {
    if (i == n_) {
      double step = 0;
      Misfit misfit;
      if (bounder_.Backward(&step, &misfit)) Consider(step, recomputed, offloaded);
      return;
    }
    for (UnitChoice c : kChoices) {
      if (!Allowed(p_, i, c)) continue;
      Misfit misfit;
      if (!bounder_.Forward(i, c, &misfit)) continue;
      choice_[i] = c;
      const UnitCost& u = p_.units[i];
      const double r = recompute_ns + ReRunNs(u, c);
      // Every completion of this prefix takes at least this long. The slack
      // keeps rounding from skipping an equal (tie-breaking) completion.
      const double least =
          bounder_.ForwardEnd(i) + rest_forward_[i + 1] + all_backward_ + r;
      if (found_ && least > best_.step_ns + 1e-9 * std::max(1.0, best_.step_ns)) {
        continue;
      }
      Visit(i + 1, recomputed + ReRuns(c),
            offloaded + OutBytes(u, c), r);
    }
  }

  void Consider(double step, int recomputed, int64_t offloaded) {
    if (found_) {
      if (!Near(step, best_.step_ns)) {
        if (step > best_.step_ns) return;
      } else if (recomputed != best_recomputed_) {
        if (recomputed > best_recomputed_) return;
      } else if (offloaded >= best_offloaded_) {
        return;
      }
    }
    found_ = true;
    best_.step_ns = step;
    best_.choice = choice_;
    best_.compute_ns = ComputeNs(p_, choice_);
    best_recomputed_ = recomputed;
    best_offloaded_ = offloaded;
  }

  const JointProblem& p_;
  const int n_;
  Bounder bounder_;
  std::vector<UnitChoice> choice_;
  std::vector<double> rest_forward_;  // forward_ns of units i..n-1
  double all_backward_ = 0;
  bool found_ = false;
  JointLimitResult best_;
  int best_recomputed_ = 0;
  int64_t best_offloaded_ = 0;
};

}  // namespace

StatusOr<JointLimitResult> JointLimit(const JointProblem& p) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (n > kJointLimitMaxUnits) {
    return InvalidArgumentError(
        "joint limit: " + std::to_string(n) + " units, more than the " +
        std::to_string(kJointLimitMaxUnits) + " its exact search takes");
  }
  int64_t choices = 1;
  for (int i = 0; i < n; ++i) {
    int allowed = 0;
    for (UnitChoice c : kChoices) {
      allowed += Allowed(p, i, c);
    }
    choices *= allowed;
  }
  if (choices > kJointLimitMaxChoices) {
    return InvalidArgumentError(
        "joint limit: " + std::to_string(choices) + " choices of the " +
        std::to_string(n) +
        " units (selective ones have four, five where offloadable), more "
        "than the " + std::to_string(kJointLimitMaxChoices) +
        " its exact search takes");
  }
  Search search(p);
  search.Run();
  if (!search.found()) {
    std::string allowed = "keep";
    if (p.allow_offload) allowed += "/offload";
    if (p.allow_recompute) allowed += "/recompute";
    if (p.allow_recompute &&
        std::any_of(p.units.begin(), p.units.end(),
                    [](const UnitCost& u) { return u.selective; })) {
      allowed +=
          p.allow_offload ? "/selective/selective-offload" : "/selective";
    }
    return ResourceExhaustedError(
        "joint limit: no " + allowed + " choice of the " + std::to_string(n) +
        " units fits the budget of " + Bytes(p.budget));
  }
  return search.result();
}

StatusOr<double> JointChoiceBound(const JointProblem& p,
                                  const std::vector<UnitChoice>& choice) {
  OFFLOAD_RETURN_IF_ERROR(ValidateJointProblem(p));
  const int n = static_cast<int>(p.units.size());
  if (static_cast<int>(choice.size()) != n) {
    return InvalidArgumentError("joint limit: " + std::to_string(choice.size()) +
                                " choices for " + std::to_string(n) + " units");
  }
  Bounder bounder(p);
  Misfit misfit;
  for (int i = 0; i < n; ++i) {
    if (!Allowed(p, i, choice[i])) {
      return InvalidArgumentError(
          "joint limit, unit " + std::to_string(i) + ": " +
          UnitChoiceName(choice[i]) + " is not allowed by the problem");
    }
    if (!bounder.Forward(i, choice[i], &misfit)) return MisfitError(p, misfit);
  }
  double step = 0;
  if (!bounder.Backward(&step, &misfit)) return MisfitError(p, misfit);
  return step;
}

}  // namespace offload
