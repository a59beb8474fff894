// The end of the byte-budget policy's iterations (budget_policy.h): the
// plan made from a recorded iteration, the workloads' plans kept,
// FinishBackward, AbandonIteration and EndTraversal (SPEC §4.7, §7).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/budget/budget_policy.h"
#include "engine/core/push_checks.h"
#include "engine/policy/layer_steps.h"

namespace offload {

Status BudgetPolicy::MakePlan() {
  BudgetRecording recording;
  recording.layers = options_.model_layers;
  recording.forward_pushes = pushes_;
  recording.backward_calls = backward_calls_;
  for (const Unit& live : units_) {
    BudgetUnit unit;
    unit.layer = live.layer;
    unit.bytes = live.bytes;
    unit.first_push = live.first_push;
    unit.last_push = live.last_push;
    unit.dropped_at = live.dropped_at >= 0 ? live.dropped_at : pushes_;
    unit.first_use = live.first_use;
    unit.free_at = live.free_at >= 0 ? live.free_at : backward_calls_;
    unit.done_at = live.done_at >= 0 ? live.done_at : backward_calls_;
    recording.units.push_back(unit);
  }
  // A recomputed layer's re-created tensors are on device from its
  // BackwardStep to the next one (SPEC §4.8).
  if (joint_.has_value()) {
    recording.held_outside.assign(backward_calls_, 0);
    for (int c = 0; c < backward_calls_; ++c) {
      const int layer = call_layers_[c];
      if (Recompute(layer)) {
        recording.held_outside[c] =
            options_.recompute->layers[layer].recompute_bytes;
      }
    }
  }
  // SPEC §4.7: with a probe, the bytes in use outside the engine's saved
  // tensors, in the forward and in the backward (max with the above).
  if (probe_ != nullptr && !forward_outside_.empty()) {
    recording.outside_counts_drops = true;
    recording.forward_outside = forward_outside_;
    recording.forward_outside.resize(pushes_, 0);
    if (recording.held_outside.empty()) {
      recording.held_outside.assign(backward_calls_, 0);
    }
    for (int c = 0; c < backward_calls_ &&
                    c < static_cast<int>(backward_outside_.size());
         ++c) {
      recording.held_outside[c] =
          std::max(recording.held_outside[c], backward_outside_[c]);
    }
  }
  // SPEC §7.8: a budget no plan can keep is refused once, naming the
  // smallest that fits, which is planned instead (the loop goes on).
  StatusOr<int64_t> smallest = SmallestBudget(recording);
  int64_t budget = budget_;
  if (smallest.ok() && *smallest > budget_) {
    budget = *smallest;
    if (!options_.smallest_budget) refused_ = *smallest;
  }
  StatusOr<BudgetPlan> plan = PlanBudget(recording, budget);
  if (!plan.ok()) {
    recording_.reset();
    plan_.reset();
    return plan.status().WithContext(
        "no activation-budget plan (offloading stays off; the next "
        "iteration is recorded again)");
  }
  recording_ = std::move(recording);
  plan_ = std::move(plan).value();
  // This workload's earlier plan, if one was kept, is replaced.
  if (!recording_->units.empty()) {
    const FirstUnit key = FirstUnitOf(*recording_);
    std::erase_if(kept_, [&key](const Workload& w) {
      return FirstUnitOf(w.recording) == key;
    });
    std::erase(record_next_, key);
  }
  release_at_push_.clear();
  free_at_call_.clear();
  reload_order_.clear();
  for (size_t i = 0; i < recording_->units.size(); ++i) {
    if (!plan_->offloaded[i]) continue;
    release_at_push_[plan_->release_at[i]].push_back(static_cast<int>(i));
    free_at_call_[recording_->units[i].done_at].push_back(static_cast<int>(i));
    if (plan_->reload_at[i] >= 0) reload_order_.push_back(static_cast<int>(i));
  }
  std::stable_sort(reload_order_.begin(), reload_order_.end(),
                   [this](int a, int b) {
                     return plan_->reload_at[a] < plan_->reload_at[b];
                   });
  if (refused_.has_value()) {
    const int64_t fits = *refused_;
    refused_.reset();
    return ResourceExhaustedError(
        "activation budget of " + std::to_string(budget_) +
        " bytes: no plan keeps it (the smallest budget that fits this "
        "workload is " + std::to_string(fits) + " bytes); planned for " +
        std::to_string(fits) + " bytes instead");
  }
  return OkStatus();
}

Status BudgetPolicy::FinishBackward() {
  Busy busy(busy_);
  if (!options_.enabled) {
    forward_count_ = 0;
    return OkStatus();
  }
  if (traversals_ == 0) {
    OFFLOAD_RETURN_IF_ERROR(CheckFinishBackward(Iteration(), backward_count_));
  }
  // The iteration ends whatever fails here; memory whose free could not be
  // ordered is kept (warned) and the first such error returned.
  NoteBackwardDrops(backward_calls_);
  ProbeAtCall(backward_calls_);
  Status first =
      EndIteration(core_, groups_, options_.retain_pinned_buffers);
  // A recorded iteration gives the plan of the next; after one whose
  // workload differed from the recording, the next is recorded again.
  if (!plan_.has_value()) {
    // A recording traversed more than once planned at its first
    // traversal's end (EndTraversal).
    if (traversals_ == 0) first.Update(MakePlan());
  } else if (diverged_) {
    KeepDivergedWorkload();
  }
  ResetIteration();
  return first.WithContext("FinishBackward (the iteration ended)");
}

Status BudgetPolicy::AbandonIteration() {
  Busy busy(busy_);
  if (!options_.enabled || forward_count_ == 0) {
    forward_count_ = 0;
    return OkStatus();
  }
  const std::string where = "AbandonIteration of " + Iteration();
  // Nothing pushed (every tensor under the size threshold): nothing to
  // release or record, nothing to say.
  if (pushes_ > 0) {
    core_.Warn(where + ": dropped after " + std::to_string(forward_count_) +
               " of " + std::to_string(options_.model_layers) +
               " layers' forward and " + std::to_string(backward_count_) +
               " layers' backward; its memory was released" +
               (plan_.has_value() ? ""
                                  : " (its recording is discarded: the next "
                                    "iteration records again)"));
  }
  Status first = EndIteration(core_, groups_, options_.retain_pinned_buffers);
  if (diverged_) KeepDivergedWorkload();
  ResetIteration();
  return first.WithContext(where + " (the iteration ended)");
}

Status BudgetPolicy::EndTraversal() {
  Busy busy(busy_);
  if (!options_.enabled) return OkStatus();
  const std::string where = "EndTraversal of " + Iteration();
  OFFLOAD_RETURN_IF_ERROR(CheckEndTraversal(where, options_.keep_host_copies,
                                            backward_count_, traversals_));
  Status first = OkStatus();
  // A recording's first traversal is one backward: the plan is made from
  // it (a loop that traverses every graph twice still gets one).
  if (!plan_.has_value() && traversals_ == 0 && !diverged_) {
    NoteBackwardDrops(backward_calls_);
    ProbeAtCall(backward_calls_);
    first.Update(MakePlan());
  }
  first.Update(offload::EndTraversal(core_, groups_));
  // The next traversal follows the plan's reloads and frees again, from
  // its first call; units it does not reach stay on host.
  backward_calls_ = 0;
  backward_count_ = 0;
  backward_layer_ = -1;
  call_layers_.clear();
  backward_begun_.assign(options_.model_layers, false);
  deferred_frees_.clear();
  next_reload_ = 0;
  for (Unit& unit : units_) unit.pops = 0;
  ++traversals_;
  return first.WithContext(where);
}

BudgetPolicy::FirstUnit BudgetPolicy::FirstUnitOf(
    const BudgetRecording& recording) {
  const BudgetUnit& u = recording.units[0];
  return FirstUnit{u.layer, u.bytes, u.first_push};
}

BudgetPolicy::FirstUnit BudgetPolicy::FirstUnitOf(const Unit& unit) {
  return FirstUnit{unit.layer, unit.bytes, unit.first_push};
}

void BudgetPolicy::ChooseWorkload(int push) {
  const Unit& live = units_[0];
  const FirstUnit key = FirstUnitOf(live);
  const bool record = std::find(record_next_.begin(), record_next_.end(),
                                key) != record_next_.end();
  if (plan_.has_value() && !recording_->units.empty() && !record) {
    if (FirstUnitOf(*recording_) == key) return;
  }
  if (!record) {
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (FirstUnitOf(kept_[i].recording) == key) {
        TakeWorkload(i);
        return;
      }
    }
  }
  if (!plan_.has_value()) return;  // recorded already
  const BudgetUnit& first = recording_->units.empty() ? BudgetUnit{}
                                                      : recording_->units[0];
  const bool shorter = !recording_->units.empty() &&
                       first.layer == live.layer &&
                       first.first_push == live.first_push &&
                       (live.bytes <= first.bytes || options_.smallest_budget);
  if ((shorter && !record) || (probe_ != nullptr && push > 0)) return;
  core_.Warn("activation budget: a new workload in " + Iteration() +
             ": its first unit (" + LayerName(live.layer) + ", " +
             std::to_string(live.bytes) + " bytes, push " +
             std::to_string(live.first_push) + ") is not the plan's (" +
             LayerName(first.layer) + ", " + std::to_string(first.bytes) +
             " bytes, push " + std::to_string(first.first_push) +
             "); this iteration is recorded, and the plan of each workload "
             "is kept for when it comes again");
  KeepWorkload();
}

void BudgetPolicy::KeepWorkload() {
  if (!plan_.has_value()) return;
  if (!recording_->units.empty()) {
    kept_.push_back(Workload{std::move(*recording_), std::move(*plan_),
                             std::move(release_at_push_),
                             std::move(free_at_call_),
                             std::move(reload_order_)});
    if (kept_.size() > kKeptWorkloads) kept_.erase(kept_.begin());
  }
  recording_.reset();
  plan_.reset();
  release_at_push_.clear();
  free_at_call_.clear();
  reload_order_.clear();
}

void BudgetPolicy::TakeWorkload(size_t i) {
  Workload taken = std::move(kept_[i]);
  kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
  KeepWorkload();
  recording_ = std::move(taken.recording);
  plan_ = std::move(taken.plan);
  release_at_push_ = std::move(taken.release_at_push);
  free_at_call_ = std::move(taken.free_at_call);
  reload_order_ = std::move(taken.reload_order);
}

void BudgetPolicy::KeepDivergedWorkload() {
  if (!units_.empty()) {
    const FirstUnit key = FirstUnitOf(units_[0]);
    if (std::find(record_next_.begin(), record_next_.end(), key) ==
        record_next_.end()) {
      record_next_.push_back(key);
      if (record_next_.size() > kKeptWorkloads) {
        record_next_.erase(record_next_.begin());
      }
    }
  }
  KeepWorkload();
}

void BudgetPolicy::ResetIteration() {
  handles_.NextIteration();
  diverged_ = false;
  forward_count_ = 0;
  open_layer_ = -1;
  pushes_ = 0;
  backward_calls_ = 0;
  backward_count_ = 0;
  backward_layer_ = -1;
  call_layers_.clear();
  backward_begun_.assign(options_.model_layers, false);
  units_.clear();
  first_held_ = 0;
  pending_releases_.clear();
  deferred_frees_.clear();
  next_reload_ = 0;
  live_views_.clear();
  traversals_ = 0;
  forward_outside_.clear();
  backward_outside_.clear();
  probe_start_.reset();
}

}  // namespace offload
