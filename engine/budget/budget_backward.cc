// The byte-budget policy's backward (budget_policy.h): frees per backward
// layer and reloads where the plan puts them (budget_iteration.cc ends the
// iteration).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/budget/budget_policy.h"
#include "engine/core/push_checks.h"
#include "engine/policy/layer_steps.h"

namespace offload {

Status BudgetPolicy::CloseUnits() {
  for (size_t i = 0; i < units_.size(); ++i) {
    if (units_[i].offloaded &&
        groups_[i]->state() == GroupState::kNotOffloaded) {
      Status started = groups_[i]->StartOffload(options_.retain_pinned_buffers);
      if (!started.ok()) return started;
    }
  }
  return OkStatus();
}

Status BudgetPolicy::RunReloads(int call) {
  if (!plan_.has_value()) return OkStatus();
  int64_t resident = -1;  // ResidentNow(), counted once when first needed
  while (next_reload_ < reload_order_.size()) {
    const int unit = reload_order_[next_reload_];
    const int64_t bytes = recording_->units[unit].bytes;
    // Due at this call, or earlier where the budget has room: only where
    // this iteration follows the plan (else the units are not its units),
    // and not over a call where the caller holds bytes outside (the plan
    // counted on this unit not being there yet).
    if (plan_->reload_at[unit] > call) {
      if (!planned()) break;
      if (HeldOutsideIn(call >= 0 ? call : backward_calls_ - 1,
                        plan_->reload_at[unit])) {
        break;
      }
      if (resident < 0) resident = ResidentNow();
      if (resident + bytes > budget_) break;
    } else if (planned() && ViewsHeldPastFree()) {
      // Due, but the plan's frees at this call left memory held by popped
      // views: where it does not fit beside them, the last view's drop
      // starts it (OnViewDropped), or its first pop does.
      if (resident < 0) resident = ResidentNow();
      if (resident + bytes > budget_) break;
    }
    if (unit < static_cast<int>(units_.size()) && units_[unit].offloaded &&
        groups_[unit]->state() == GroupState::kOffloadFinished) {
      OFFLOAD_RETURN_IF_ERROR(groups_[unit]->StartReload());
      if (resident >= 0) resident += bytes;
    }
    ++next_reload_;
  }
  return OkStatus();
}

Status BudgetPolicy::BackwardStep(int layer) {
  Busy busy(busy_);
  const int n = options_.model_layers;
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "BackwardStep(" + LayerName(layer) + ") in " + Iteration();
  OFFLOAD_RETURN_IF_ERROR(
      CheckBackwardStep(where, layer, n, forward_count_, backward_begun_));
  open_layer_ = -1;
  RetryReleases();
  OFFLOAD_RETURN_IF_ERROR(CloseUnits().WithContext(where));
  NoteBackwardDrops(backward_calls_);
  ProbeAtCall(backward_calls_);
  OFFLOAD_RETURN_IF_ERROR(RunFrees(backward_calls_).WithContext(where));
  OFFLOAD_RETURN_IF_ERROR(RunReloads(backward_calls_).WithContext(where));
  backward_layer_ = layer;
  CountBackwardCall();
  backward_begun_[layer] = true;
  backward_count_++;
  return OkStatus();
}

void BudgetPolicy::NoteBackwardDrops(int call) {
  if (planned()) return;
  for (Unit& unit : units_) {
    if (unit.offloaded) continue;  // a diverged iteration: not watched
    if (unit.free_at < 0 && unit.watch.expired()) unit.free_at = call;
    // With a probe, also the popped views must be gone (PopOne counts
    // them): a view the caller still holds keeps its memory in use.
    const size_t i = &unit - units_.data();
    const bool views_held =
        probe_ != nullptr && i < live_views_.size() && live_views_[i] > 0;
    if (unit.done_at < 0 &&
        (unit.free_at >= 0 ||
         (unit.pops >= unit.handles && !views_held &&
          unit.watch.use_count() <= unit.handles))) {
      unit.done_at = call;
    }
  }
}

bool BudgetPolicy::FreedAtThisCall(int unit) const {
  if (backward_count_ == 0 || unit >= static_cast<int>(units_.size()) ||
      !units_[unit].offloaded ||
      groups_[unit]->state() == GroupState::kReleased ||
      units_[unit].pops < groups_[unit]->size()) {
    return false;
  }
  auto has = [unit](const std::vector<int>& units) {
    return std::find(units.begin(), units.end(), unit) != units.end();
  };
  auto due = free_at_call_.find(backward_calls_);
  return has(deferred_frees_) ||
         (due != free_at_call_.end() && has(due->second));
}

Status BudgetPolicy::FreeUnit(int unit) {
  // SPEC §7.3: with keep_host_copies the host copy stays for a later
  // traversal; only the reloaded memory goes.
  if (options_.keep_host_copies) return groups_[unit]->DropReloaded();
  return groups_[unit]->ReleaseAll(options_.retain_pinned_buffers);
}

Status BudgetPolicy::RunFrees(int call) {
  if (auto it = free_at_call_.find(call); it != free_at_call_.end()) {
    for (int unit : it->second) deferred_frees_.push_back(unit);
  }
  Status first = OkStatus();
  std::vector<int> left;
  for (int unit : deferred_frees_) {
    if (unit >= static_cast<int>(units_.size()) || !units_[unit].offloaded ||
        groups_[unit]->state() == GroupState::kReleased) {
      continue;
    }
    // Freed only once every handle of this iteration was popped: a
    // backward that differs from the recording defers the free (and the
    // next iteration is recorded again) rather than lose a tensor.
    if (units_[unit].pops < groups_[unit]->size()) {
      if (!diverged_) {
        diverged_ = true;
        core_.Warn("activation budget: the backward of " + Iteration() +
                   " differs from the recording (" + groups_[unit]->Where() +
                   " is not fully popped where the plan frees it); its free "
                   "waits, and the next iteration is recorded again");
      }
      left.push_back(unit);
      continue;
    }
    first.Update(FreeUnit(unit));
  }
  deferred_frees_ = std::move(left);
  return first;
}

void BudgetPolicy::NoteUse(const SavedTensor& saved) {
  if (backward_count_ == 0) return;
  auto note = [&](const SavedTensor& s) {
    int unit = -1;
    if (const SavedTensor::InGroup* entry = s.group_entry()) {
      unit = entry->group;  // counted always: frees wait for every pop
    } else if (const SavedTensor::Kept* kept = s.kept()) {
      // Kept units are looked up only where a plan will be made from them.
      if (planned()) return;
      for (int i = static_cast<int>(units_.size()) - 1; i >= 0; --i) {
        if (units_[i].storage == kept->tensor.storage.get()) {
          unit = i;
          break;
        }
      }
    }
    if (unit < 0 || unit >= static_cast<int>(units_.size())) return;
    if (units_[unit].first_use < 0) units_[unit].first_use = backward_calls_;
    ++units_[unit].pops;
  };
  if (const SavedTensor::Composite* composite = saved.composite()) {
    for (const auto& component : composite->components) {
      if (component.has_value()) note(*component);
    }
  } else {
    note(saved);
  }
}

int64_t BudgetPolicy::ResidentNow() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& unit = units_[i];
    if (!unit.offloaded) {
      if (!unit.watch.expired()) bytes += unit.bytes;
      continue;
    }
    // A unit whose reloaded memory the plan freed (released, or back to
    // its host copy alone) still holds it while the caller holds a popped
    // view: autograd drops a saved tensor once the node that read it has
    // run, which may come after the plan's free.
    const GroupState state = groups_[i]->state();
    const bool views_held = i < live_views_.size() && live_views_[i] > 0;
    if ((state != GroupState::kOffloadFinished &&
         state != GroupState::kReleased) ||
        views_held) {
      bytes += unit.bytes;
    }
  }
  return bytes;
}

bool BudgetPolicy::ViewsHeldPastFree() const {
  for (size_t i = 0; i < units_.size() && i < live_views_.size(); ++i) {
    if (!units_[i].offloaded || live_views_[i] == 0) continue;
    const GroupState state = groups_[i]->state();
    if (state == GroupState::kOffloadFinished ||
        state == GroupState::kReleased) {
      return true;
    }
  }
  return false;
}

Tensor BudgetPolicy::PoppedView(Tensor tensor, int unit) {
  if (unit >= 0) {
    if (static_cast<int>(live_views_.size()) <= unit) {
      live_views_.resize(unit + 1, 0);
    }
    ++live_views_[unit];
  }
  std::shared_ptr<Storage> held = std::move(tensor.storage);
  Storage* storage = held.get();
  // A deleter that only lets go of the real handle, then tells the policy
  // (if it still exists): the storage itself lives as long as anyone else
  // holds it, as before.
  tensor.storage = std::shared_ptr<Storage>(
      storage, [held = std::move(held), hub = std::weak_ptr<DropHub>(hub_),
                unit, iteration = handles_.iteration()](Storage*) mutable {
        held.reset();
        if (std::shared_ptr<DropHub> alive = hub.lock();
            alive != nullptr && alive->policy != nullptr) {
          alive->policy->OnViewDropped(unit, iteration);
        }
      });
  return tensor;
}

void BudgetPolicy::OnViewDropped(int unit, uint64_t iteration) {
  if (iteration != handles_.iteration()) return;
  if (unit >= 0) {
    if (unit >= static_cast<int>(live_views_.size())) return;
    if (--live_views_[unit] > 0) return;
  }
  // Inside a call (the engine let go of a view itself), the call's own
  // frees and reloads follow the plan.
  if (busy_ > 0 || !planned()) return;
  Busy busy(busy_);
  if (unit >= 0 && unit < static_cast<int>(units_.size()) &&
      units_[unit].offloaded && units_[unit].pops >= groups_[unit]->size()) {
    const GroupState state = groups_[unit]->state();
    if (state == GroupState::kReloadStarted ||
        state == GroupState::kKeptOnDevice) {
      Status released = FreeUnit(unit);
      if (!released.ok()) {
        core_.Warn("activation budget: freeing " + groups_[unit]->Where() +
                   " when its last popped view was dropped: " +
                   released.ToString());
      }
    }
  }
  Status reloads = RunReloads(-1);
  if (!reloads.ok()) {
    core_.Warn("activation budget: a reload started when a popped view was "
               "dropped failed and is retried at the next call: " +
               reloads.ToString());
  }
}

StatusOr<Tensor> BudgetPolicy::PopOne(const SavedTensor& saved) {
  if (const SavedTensor::Kept* kept = saved.kept()) {
    // Dropping it can make room for a reload: tell the policy then.
    if (planned() && next_reload_ < reload_order_.size()) {
      return PoppedView(kept->tensor, -1);
    }
    // Recording with a probe: the unit's memory is done once the popped
    // views are dropped too (NoteBackwardDrops).
    if (probe_ != nullptr && !plan_.has_value() && backward_count_ > 0) {
      for (int i = static_cast<int>(units_.size()) - 1; i >= 0; --i) {
        if (units_[i].storage == kept->tensor.storage.get()) {
          return PoppedView(kept->tensor, i);
        }
      }
    }
    return kept->tensor;
  }
  const SavedTensor::InGroup* entry = saved.group_entry();
  if (entry == nullptr || entry->group < 0 ||
      entry->group >= static_cast<int>(groups_.size()) ||
      groups_[entry->group] == nullptr) {
    return InvalidArgumentError("Pop: a malformed SavedTensor (no unit " +
                                std::string(entry ? std::to_string(entry->group)
                                                  : "entry") + ")");
  }
  OffloadGroup& group = *groups_[entry->group];
  if (group.state() == GroupState::kOffloadFinished) {
    // Its reload was not planned by now (the workload changed): start it
    // here; the pop then waits for it.
    OFFLOAD_RETURN_IF_ERROR(group.StartReload().WithContext("Pop"));
  }
  OFFLOAD_ASSIGN_OR_RETURN(Tensor tensor, group.Pop(entry->index));
  return PoppedView(std::move(tensor), entry->group);
}

Status BudgetPolicy::CheckPoppable(const SavedTensor& saved,
                                              bool composite) const {
  if (saved.is_composite() != composite) {
    return InvalidArgumentError(
        composite ? "PopComposite of a plain handle (use Pop)"
                  : "Pop of a composite handle (use PopComposite)");
  }
  auto check = [&](const SavedTensor& s) -> Status {
    const SavedTensor::InGroup* entry = s.group_entry();
    if (entry == nullptr) return OkStatus();
    if (entry->group < 0 || entry->group >= static_cast<int>(groups_.size()) ||
        groups_[entry->group] == nullptr) {
      return InvalidArgumentError("Pop: a malformed SavedTensor (no unit " +
                                  std::to_string(entry->group) + ")");
    }
    if (groups_[entry->group]->state() == GroupState::kReleased) {
      return FailedPreconditionError(
          "Pop of tensor #" + std::to_string(entry->index) + " of " +
          groups_[entry->group]->Where() +
          ": its memory was freed after all its handles were popped");
    }
    if (FreedAtThisCall(entry->group)) {
      return FailedPreconditionError(
          "Pop of tensor #" + std::to_string(entry->index) + " of " +
          groups_[entry->group]->Where() +
          ": all its handles were popped and the plan frees its memory at "
          "this call (nothing changed)");
    }
    return OkStatus();
  };
  if (const SavedTensor::Composite* c = saved.composite()) {
    for (const auto& component : c->components) {
      if (component.has_value()) OFFLOAD_RETURN_IF_ERROR(check(*component));
    }
    return OkStatus();
  }
  return check(saved);
}

StatusOr<Tensor> BudgetPolicy::Pop(const SavedTensor& saved) {
  Busy busy(busy_);
  OFFLOAD_RETURN_IF_ERROR(handles_.Check(saved, options_.enabled, "Pop"));
  // Checked before the frees and reloads this call runs: a refused pop
  // changes nothing.
  OFFLOAD_RETURN_IF_ERROR(CheckPoppable(saved, /*composite=*/false));
  if (backward_count_ > 0) {
    NoteBackwardDrops(backward_calls_);
    ProbeAtCall(backward_calls_);
    OFFLOAD_RETURN_IF_ERROR(RunFrees(backward_calls_).WithContext("Pop"));
    OFFLOAD_RETURN_IF_ERROR(RunReloads(backward_calls_).WithContext("Pop"));
  }
  OFFLOAD_ASSIGN_OR_RETURN(
      Tensor tensor,
      PopPlain(saved, [this](const SavedTensor& s) { return PopOne(s); }));
  NoteUse(saved);
  if (backward_count_ > 0) CountBackwardCall();
  return tensor;
}

StatusOr<CompositeTensor> BudgetPolicy::PopComposite(
    const SavedTensor& saved) {
  Busy busy(busy_);
  OFFLOAD_RETURN_IF_ERROR(handles_.Check(saved, options_.enabled,
                                         "PopComposite"));
  OFFLOAD_RETURN_IF_ERROR(CheckPoppable(saved, /*composite=*/true));
  if (backward_count_ > 0) {
    NoteBackwardDrops(backward_calls_);
    ProbeAtCall(backward_calls_);
    OFFLOAD_RETURN_IF_ERROR(
        RunFrees(backward_calls_).WithContext("PopComposite"));
    OFFLOAD_RETURN_IF_ERROR(
        RunReloads(backward_calls_).WithContext("PopComposite"));
  }
  OFFLOAD_ASSIGN_OR_RETURN(
      CompositeTensor tensor,
      offload::PopComposite(
          saved, [this](const SavedTensor& s) { return PopOne(s); }));
  NoteUse(saved);
  if (backward_count_ > 0) CountBackwardCall();
  return tensor;
}

void BudgetPolicy::CountBackwardCall() {
  call_layers_.push_back(backward_layer_);
  ++backward_calls_;
}

bool BudgetPolicy::HeldOutsideIn(int from, int to) const {
  for (int c = std::max(from, 0); c < to; ++c) {
    if (recording_->HeldOutside(c) > 0) return true;
  }
  return false;
}

}  // namespace offload
