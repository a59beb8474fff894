// The byte-budget schedule (SPEC §4.7): from one recorded iteration, which
// saved tensors go to host, where the compute stream waits for their copy
// so that the next tensor fits, and when each comes back. Pure data and
// functions: no backend, no engine state.
//
// The recording is a sequence of engine calls. Forward: Push calls, indexed
// 0, 1, ... in the iteration. Backward: BackwardStep and Pop calls, indexed
// 0, 1, ... (FinishBackward is index `backward_calls`). A unit is one device
// storage whose views were pushed by consecutive Push calls of one layer
// (SPEC §2: its bytes move once).
//
// The model the plan relies on, which is autograd's order and the layer
// benchmark's (bench/layer_stack.h, --push_at=gemm):
//  - each saved tensor is allocated after the previous Push returned, so
//    memory freed at Push q is free before the next saved tensor exists;
//  - a unit can free memory only once the caller dropped its own
//    references: the recording notes, at the start of each Push, which
//    units only the saved handles still hold (dropped_at), and the plan
//    releases a unit no earlier (else releasing it frees nothing:
//    stats' bytes_retained_by_caller);
//  - in the backward, the recording notes where each unit's memory went
//    (free_at: the caller dropped it) or could go if it were offloaded
//    (done_at: every handle popped and the popped tensors dropped, where
//    the policy frees the reloaded memory at the latest), and the plan
//    assumes the same. The policy may free earlier (when the caller drops
//    the last popped view, engine/budget/budget_policy.h) and start a
//    reload earlier when it fits then: that only lowers the bytes on
//    device between the plan's points.
// Under that model the plan keeps the bytes of offloadable saved tensors on
// the device within the budget at every instant (SPEC §6.2); tensors that
// are never offloaded (SPEC §1.2) come on top.

#ifndef OFFLOAD_ENGINE_PLAN_BUDGET_PLAN_H_
#define OFFLOAD_ENGINE_PLAN_BUDGET_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/status.h"

namespace offload {

struct BudgetUnit {
  int layer = 0;
  int64_t bytes = 0;    // the storage's device bytes
  int first_push = 0;   // forward Push index of its first view
  int last_push = 0;    // and of its last
  // The first Push at whose start the caller no longer held it (only the
  // saved handles did); forward_pushes if that never happened.
  int dropped_at = 0;
  int first_use = -1;   // backward call index of its first Pop; -1: none
  // Backward call index (backward_calls: FinishBackward) at whose start its
  // memory is gone when it stays on device: the caller dropped the saved
  // handles and the popped tensors.
  int free_at = 0;
  // The same when it is offloaded: every handle was popped and the caller
  // dropped the popped tensors, so that the policy frees the reloaded
  // memory there.
  int done_at = 0;
};

struct BudgetRecording {
  int layers = 0;
  int forward_pushes = 0;
  int backward_calls = 0;
  std::vector<BudgetUnit> units;  // in order of first push
  // Per backward call (empty: none held): device bytes the caller holds
  // outside the engine from the start of that call to the start of the
  // next, e.g. a recomputed layer's re-created tensors (SPEC §4.8). The
  // plan keeps them within the budget too.
  std::vector<int64_t> held_outside;
  // Per forward Push (empty: none held): device bytes outside the engine's
  // saved tensors (a probe's count, OffloadOptions::device_bytes_probe)
  // that are on device next to the units resident at that push: from the
  // end of the previous push until this one, net of the units first pushed
  // here (the plan counts those itself); for the last push, also until the
  // first backward call (e.g. the last layer's output). The plan keeps
  // them within the budget too (SPEC §4.7).
  std::vector<int64_t> forward_outside;
  // Set where held_outside comes from a probe: held_outside[c] is then the
  // most in use during call c (until the next call) less the units still
  // on device at the next call's start, so the units the caller drops
  // during call c (free_at == c + 1) are already in it and the plan does
  // not count them again there. (The probe cannot tell when in the
  // interval they went; counting against the units at its end never
  // undercounts.)
  bool outside_counts_drops = false;

  int64_t HeldOutside(int call) const {
    return call < static_cast<int>(held_outside.size()) ? held_outside[call]
                                                        : 0;
  }
  // Whether unit `unit` is counted on its own at backward call `call` (see
  // outside_counts_drops).
  bool CountedAt(int unit, int call) const {
    return !outside_counts_drops || units[unit].free_at != call + 1;
  }
  int64_t ForwardOutside(int push) const {
    return push < static_cast<int>(forward_outside.size())
               ? forward_outside[push]
               : 0;
  }
};

struct BudgetPlan {
  int64_t budget = 0;
  // Per unit (indexed like BudgetRecording::units):
  std::vector<bool> offloaded;
  // Push index at whose end its device memory is released (the compute
  // stream waits for its copy); -1 if not offloaded.
  std::vector<int> release_at;
  // Backward call index at whose start its reload begins; -1 if not
  // offloaded.
  std::vector<int> reload_at;
  // The most offloadable bytes on device at once under the plan (with the
  // bytes held outside, BudgetRecording::held_outside and
  // forward_outside).
  int64_t peak_bytes = 0;

  int64_t OffloadedBytes(const BudgetRecording& recording) const;
};

// Plans `recording` within `budget` bytes: units are released, earliest
// pushed first among those the caller dropped, only when the next unit
// (next to the bytes outside the engine at that push, forward_outside)
// would not fit; a released unit's
// copy starts when its last view is pushed; reloads start in order of first
// use, each as soon as it fits after the frees of that call (next to the
// bytes held outside at that call and every later one while it is on
// device), and at the latest at its first use; where a reload fits nowhere
// because units kept beside it hold the room until their layer's end, the
// earliest pushed of them that a reload would free by then goes to host
// too (released at the end of the forward) and the backward is planned
// again. With a probe's recording
// (forward_outside not empty), where bytes held outside at a backward call
// leave too little room for the units kept there, units first used after
// that call go to host too (earliest pushed first), released at the end of
// the forward.
// Errors: kInvalidArgument if budget <= 0 or the recording is inconsistent
//   (ValidateRecording); kResourceExhausted naming the layer, unit and bytes
//   where no plan can keep the budget (a unit larger than it, or units that
//   cannot be released yet).
StatusOr<BudgetPlan> PlanBudget(const BudgetRecording& recording,
                                int64_t budget);

// The least budget PlanBudget can keep for `recording` (searched between 1
// and every unit's bytes plus the most held outside in the forward or the
// backward, where nothing needs to move; a plan that fits a budget fits
// every larger one, as the property test checks). Errors: as
// ValidateRecording.
StatusOr<int64_t> SmallestBudget(const BudgetRecording& recording);

// Checks a recording: units in order of first push, pushes in range and
// not interleaved within a layer's unit, dropped after its last push, uses
// and frees in range, each unit's use before its free, held_outside empty
// or one non-negative value per backward call, forward_outside empty or one
// non-negative value per forward push. Errors: kInvalidArgument naming the
// unit or the field.
Status ValidateRecording(const BudgetRecording& recording);

// Checks `plan` against `recording` independently of PlanBudget: sizes
// match; an offloaded unit is released at or after its last push and its
// drop, reloaded after the forward and no
// later than its first use; and replaying the calls, the offloadable bytes
// on device plus those outside the engine (forward_outside, held_outside)
// never exceed the budget and equal peak_bytes at most.
// Errors: kInvalidArgument naming the unit and the rule.
Status ValidateBudgetPlan(const BudgetPlan& plan,
                          const BudgetRecording& recording);

// A table: one row per unit (layer, bytes, offloaded, release, reload),
// then the totals and the peak against the budget.
std::string FormatBudgetPlan(const BudgetPlan& plan,
                             const BudgetRecording& recording);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_BUDGET_PLAN_H_
