// The joint plan's and the limit's tests (joint_plan_test.cc,
// joint_limit_test.cc) share these: a stack of identical units, whose cases
// are worked by hand, and a random unit for their properties.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_TESTING_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_TESTING_H_

#include <cstdint>
#include <vector>

#include "engine/plan/joint_plan.h"
#include "rapidcheck.h"

namespace offload {

// One letter a choice, for the expected plans of the joint tests.
inline constexpr UnitChoice K = UnitChoice::kKeep;
inline constexpr UnitChoice O = UnitChoice::kOffload;
inline constexpr UnitChoice R = UnitChoice::kRecompute;
inline constexpr UnitChoice S = UnitChoice::kSelective;

// The simple alternatives a joint plan must be no slower than: all kept,
// each recomputable unit re-run alone (in full, and selectively where it
// may), all re-run in full, and all selectively where they may.
inline std::vector<std::vector<UnitChoice>> SimpleAlternatives(
    const JointProblem& p) {
  const int n = static_cast<int>(p.units.size());
  std::vector<std::vector<UnitChoice>> alternatives = {
      std::vector<UnitChoice>(n, K)};
  std::vector<UnitChoice> all(n, K), all_selective(n, K);
  for (int i = 0; i < n; ++i) {
    if (!p.units[i].recomputable || !p.allow_recompute) continue;
    all[i] = R;
    all_selective[i] = p.units[i].selective ? S : R;
    std::vector<UnitChoice> one(n, K);
    one[i] = R;
    alternatives.push_back(one);
    if (p.units[i].selective) {
      one[i] = S;
      alternatives.push_back(one);
    }
  }
  alternatives.push_back(all);
  alternatives.push_back(all_selective);
  return alternatives;
}

// Units of 300 bytes, forward 100 ns, backward 200 ns; recomputing one
// keeps its 30-byte input, takes 100 ns and holds 270 bytes during its
// backward. Copies of 300 bytes at `gbps` (bytes per ns) take 300 / gbps ns.
// Not selective (SelectiveStack below).
inline JointProblem Stack(int units, double gbps, int64_t budget) {
  JointProblem p;
  for (int i = 0; i < units; ++i) {
    UnitCost u;
    u.saved_bytes = 300;
    u.forward_ns = 100;
    u.backward_ns = 200;
    u.recomputable = true;
    u.input_bytes = 30;
    u.recompute_ns = 100;
    u.recompute_bytes = 270;
    p.units.push_back(u);
  }
  p.d2h_gbps = p.h2d_gbps = gbps;
  p.budget = budget;
  return p;
}

// Stack's units, each may be selective too: it keeps `kept` bytes (its input
// and its costly ops' outputs) and re-runs its cheap ops in `ns`.
inline JointProblem SelectiveStack(int units, double gbps, int64_t budget,
                                   int64_t kept = 60, double ns = 10) {
  JointProblem p = Stack(units, gbps, budget);
  for (UnitCost& u : p.units) {
    u.selective = true;
    u.selective_bytes = kept;
    u.selective_ns = ns;
  }
  return p;
}

// A random unit for the properties: up to `most_bytes` saved bytes, times
// up to 2000 ns, recomputable or not, input bytes within its saved bytes
// and re-created bytes up to a quarter above them, half of the recomputable
// ones with a recomputed forward's transient up to `most_bytes`; half of the recomputable
// ones may be selective (1 to saved_bytes kept, a re-run up to 1000 ns,
// half of those with selective transients of up to `most_bytes`); half of
// all hold transients of up to `most_bytes` in their forward and backward.
inline rc::Gen<UnitCost> GenUnitCost(int64_t most_bytes = 1000) {
  return rc::gen::exec([most_bytes] {
    UnitCost u;
    u.saved_bytes = *rc::gen::inRange<int64_t>(1, most_bytes + 1);
    u.forward_ns = *rc::gen::inRange(0, 1000);
    u.backward_ns = *rc::gen::inRange(0, 2000);
    u.recomputable = *rc::gen::arbitrary<bool>();
    u.input_bytes = *rc::gen::inRange<int64_t>(0, u.saved_bytes + 1);
    // A re-run may hold more than the unit leaves (unit_cost.h).
    u.recompute_bytes =
        *rc::gen::inRange<int64_t>(0, u.saved_bytes + u.saved_bytes / 4 + 1);
    u.recompute_ns = *rc::gen::inRange(0, 1000);
    if (u.recomputable && *rc::gen::arbitrary<bool>()) {
      u.recompute_forward_transient_bytes =
          *rc::gen::inRange<int64_t>(0, most_bytes + 1);
    }
    if (u.recomputable && *rc::gen::arbitrary<bool>()) {
      u.selective = true;
      u.selective_bytes = *rc::gen::inRange<int64_t>(1, u.saved_bytes + 1);
      u.selective_ns = *rc::gen::inRange(0, 1000);
      if (*rc::gen::arbitrary<bool>()) {
        u.selective_forward_transient_bytes =
            *rc::gen::inRange<int64_t>(0, most_bytes + 1);
        u.selective_backward_transient_bytes =
            *rc::gen::inRange<int64_t>(0, most_bytes + 1);
      }
    }
    if (*rc::gen::arbitrary<bool>()) {
      u.forward_transient_bytes =
          *rc::gen::inRange<int64_t>(0, most_bytes + 1);
      u.backward_transient_bytes =
          *rc::gen::inRange<int64_t>(0, most_bytes + 1);
    }
    return u;
  });
}

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_PROBLEM_TESTING_H_
