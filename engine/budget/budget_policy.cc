// The byte-budget policy (budget_policy.h): recording, planning, and the
// plan's releases and reloads at the calls it names.

#include "engine/budget/budget_policy.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/push_checks.h"
#include "engine/plan/joint_problem_of.h"
#include "engine/policy/layer_steps.h"

namespace offload {

BudgetPolicy::BudgetPolicy(Backend& backend, const OffloadOptions& options,
                           std::optional<JointPlan> joint, Stream& d2h,
                           Stream& h2d)
    : options_(options),
      budget_(*options.activation_budget_bytes),
      joint_(std::move(joint)),
      core_(backend, d2h, h2d,
            CoreOptions{options.min_span_coverage, options.skip_sparse_views,
                        options.warnings_to_stderr}),
      probe_(options.device_bytes_probe) {
  backward_begun_.assign(options_.model_layers, false);
  hub_->policy = this;
}

// Popped views that outlive the policy tell nobody. Groups go first, each
// freeing its memory ordered after its copies.
BudgetPolicy::~BudgetPolicy() {
  hub_->policy = nullptr;
  groups_.clear();
}

std::string BudgetPolicy::Iteration() const { return handles_.Iteration(); }

OffloadGroup& BudgetPolicy::Group(int unit) {
  if (static_cast<int>(groups_.size()) <= unit) groups_.resize(unit + 1);
  std::unique_ptr<OffloadGroup>& group = groups_[unit];
  // Groups are reused across iterations (their events with them); one made
  // for another layer's unit is made again, so that messages name this one.
  auto label = [&] {
    return LayerName(units_[unit].layer) + " unit " + std::to_string(unit);
  };
  if (group != nullptr && group->state() == GroupState::kNotOffloaded &&
      group->size() == 0 && group->label() != label()) {
    group.reset();
  }
  if (group == nullptr) {
    group = std::make_unique<OffloadGroup>(core_, label(), /*pinned_tag=*/unit);
  }
  return *group;
}

bool BudgetPolicy::WillOffload(int layer) const {
  if (!options_.enabled || !plan_.has_value()) return false;
  for (size_t i = 0; i < recording_->units.size(); ++i) {
    if (plan_->offloaded[i] && recording_->units[i].layer == layer) return true;
  }
  return false;
}

GroupState BudgetPolicy::state(int layer) const {
  for (size_t i = 0; i < units_.size() && i < groups_.size(); ++i) {
    if (units_[i].layer == layer && units_[i].offloaded && groups_[i]) {
      return groups_[i]->state();
    }
  }
  return GroupState::kNotOffloaded;
}

int64_t BudgetPolicy::OffloadedBytes() const {
  int64_t total = core_.pinned().bytes();
  for (const auto& group : groups_) {
    if (group != nullptr) total += group->host_bytes();
  }
  return total;
}

std::string BudgetPolicy::BudgetPlanText() const {
  if (!plan_.has_value()) return "";
  return FormatBudgetPlan(*plan_, *recording_);
}

bool BudgetPolicy::Recompute(int layer) const {
  return joint_.has_value() && layer >= 0 &&
         layer < static_cast<int>(joint_->choice.size()) &&
         joint_->Recompute(layer);
}

std::string BudgetPolicy::JointPlanText() const {
  if (!joint_.has_value()) return "";
  return FormatJointPlan(*joint_, JointProblemOf(options_));
}

Status BudgetPolicy::Manual(ManualCall call, int layer) {
  if (!options_.enabled) return OkStatus();
  return FailedPreconditionError(
      std::string(ManualCallName(call)) + "(" + LayerName(layer) +
      "): only with manual_synchronization; with an activation budget the "
      "plan decides when tensors offload and reload");
}

// ---------------------------------------------------------------------------
// Forward.

StatusOr<int> BudgetPolicy::ForwardStep() {
  Busy busy(busy_);
  const int n = options_.model_layers;
  if (!options_.enabled) return forward_count_++ % n;
  OFFLOAD_RETURN_IF_ERROR(
      CheckForwardStep(Iteration(), n, forward_count_, backward_count_));
  RetryReleases();
  if (forward_count_ == 0 && probe_ != nullptr && !plan_.has_value()) {
    // The forward begins: the bytes in use before it, and a new high-water
    // mark (ProbeAtPush).
    probe_->TakePeakBytes();
    probe_start_ = probe_->InUseBytes();
  }
  const int layer = forward_count_++;
  open_layer_ = layer;
  return layer;
}

Status BudgetPolicy::CheckPush(const std::string& what) const {
  if (open_layer_ >= 0) return OkStatus();
  return FailedPreconditionError(
      "Push of " + what + ": no layer's forward is open: " +
      (forward_count_ == 0 ? "no ForwardStep yet in " + Iteration()
                           : "the backward of " + Iteration() + " began"));
}

int BudgetPolicy::UnitOf(const Tensor& tensor, int push,
                                    bool* created) {
  if (!units_.empty()) {
    Unit& last = units_.back();
    const bool collecting =
        !last.offloaded ||
        groups_[units_.size() - 1]->state() == GroupState::kNotOffloaded;
    if (last.layer == open_layer_ && last.storage == tensor.storage.get() &&
        last.last_push >= push - 1 && collecting) {
      last.last_push = push;
      *created = false;
      return static_cast<int>(units_.size()) - 1;
    }
  }
  Unit unit;
  unit.layer = open_layer_;
  unit.storage = tensor.storage.get();
  unit.watch = tensor.storage;
  unit.bytes = tensor.storage->size_bytes();
  unit.first_push = unit.last_push = push;
  units_.push_back(unit);
  *created = true;
  return static_cast<int>(units_.size()) - 1;
}

void BudgetPolicy::CheckAgainstPlan(int unit, bool created) {
  if (!planned()) return;
  const Unit& live = units_[unit];
  std::string why;
  if (unit >= static_cast<int>(recording_->units.size())) {
    why = "more units than the recording's " +
          std::to_string(recording_->units.size());
  } else {
    const BudgetUnit& rec = recording_->units[unit];
    // A batch of another length (dynamic padding) pushes the same units
    // with other sizes. Smaller ones keep to the plan's budget (every
    // resident count can only fall); larger ones too under the smallest
    // budget, which grows with the workload (torchtune's usage). A larger
    // unit under a caller's budget is a new workload.
    const bool fits = live.bytes <= rec.bytes || options_.smallest_budget;
    if (rec.layer != live.layer || !fits ||
        rec.first_push != live.first_push) {
      why = "recorded as " + LayerName(rec.layer) + ", " +
            std::to_string(rec.bytes) + " bytes, first push " +
            std::to_string(rec.first_push);
    } else if (!created && live.last_push > rec.last_push) {
      why = "more views than recorded";
    }
  }
  if (why.empty()) return;
  diverged_ = true;
  core_.Warn("activation budget: the workload changed in " + Iteration() +
             ": unit " + std::to_string(unit) + " (" + LayerName(live.layer) +
             ", " + std::to_string(live.bytes) + " bytes, push " +
             std::to_string(live.last_push) + ") " + why +
             "; the rest of the iteration stays on device and the next one "
             "is recorded again");
}

StatusOr<SavedTensor> BudgetPolicy::PushOne(const Tensor& tensor,
                                                      int push) {
  const int layer = open_layer_;
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    ++core_.stats().tensors_kept;
    return handles_.Kept(tensor, layer);
  }
  bool created = false;
  const int unit = UnitOf(tensor, push, &created);
  if (created && unit == 0) ChooseWorkload(push);
  CheckAgainstPlan(unit, created);
  const bool offload = planned() && plan_->offloaded[unit] &&
                       (created || units_[unit].offloaded);
  if (!offload) {
    ++units_[unit].handles;
    ++core_.stats().tensors_kept;
    return handles_.Kept(tensor, layer);
  }
  StatusOr<int> index = Group(unit).AddPushed(tensor);
  if (!index.ok()) {
    if (created) units_.pop_back();
    return index.status();
  }
  units_[unit].offloaded = true;
  ++core_.stats().tensors_offloaded;
  return handles_.InGroup(layer, unit, *index);
}

void BudgetPolicy::NoteDrops(int push) {
  if (planned()) return;
  for (size_t i = first_held_; i < units_.size(); ++i) {
    Unit& unit = units_[i];
    if (unit.dropped_at >= 0) continue;
    // Only the Kept handles hold it: the caller dropped its tensors. (A
    // handle copied by the caller makes this later, never earlier.)
    if (unit.offloaded || unit.watch.use_count() > unit.handles) continue;
    // Nor may the memory's owner still keep it alive (a framework tensor
    // the caller holds, StorageMemory::HeldOutside): releasing it would
    // free nothing.
    if (std::shared_ptr<Storage> storage = unit.watch.lock();
        storage != nullptr && storage->memory().HeldOutside()) {
      continue;
    }
    unit.dropped_at = push;
  }
  while (first_held_ < units_.size() && units_[first_held_].dropped_at >= 0) {
    ++first_held_;
  }
}

void BudgetPolicy::AfterPush(int push) {
  if (!planned()) return;
  // Units this push touched are the last ones.
  for (int i = static_cast<int>(units_.size()) - 1;
       i >= 0 && units_[i].last_push == push; --i) {
    if (!units_[i].offloaded ||
        groups_[i]->state() != GroupState::kNotOffloaded ||
        recording_->units[i].last_push != push) {
      continue;
    }
    // The copy fails only by keeping the unit on device (warned).
    Status started = groups_[i]->StartOffload(options_.retain_pinned_buffers);
    if (!started.ok()) core_.Warn(started.ToString());
  }
  if (auto it = release_at_push_.find(push); it != release_at_push_.end()) {
    pending_releases_.insert(pending_releases_.end(), it->second.begin(),
                             it->second.end());
  }
  RetryReleases();
}

void BudgetPolicy::RetryReleases() {
  std::vector<int> left;
  for (int unit : pending_releases_) {
    if (unit >= static_cast<int>(groups_.size()) || groups_[unit] == nullptr ||
        groups_[unit]->state() != GroupState::kOffloadStarted) {
      continue;  // kept on device, or never offloaded this iteration
    }
    Status released = groups_[unit]->ReleaseForwardMemory();
    if (!released.ok()) {
      core_.Warn("activation budget: the release of " +
                 groups_[unit]->Where() + " failed and is retried at the "
                 "next call (its memory stays until then): " +
                 released.ToString());
      left.push_back(unit);
    }
  }
  pending_releases_ = std::move(left);
}

StatusOr<SavedTensor> BudgetPolicy::Push(const Tensor& tensor) {
  Busy busy(busy_);
  if (!options_.enabled) return handles_.Kept(tensor, -1);
  if (open_layer_ < 0) return CheckPush("tensor " + tensor.Describe());
  const int layer = open_layer_;
  OFFLOAD_RETURN_IF_ERROR(
      CheckOffloadable(tensor, core_.backend(), options_.min_offload_elements,
                       WhereFn([layer] { return "Push in " + LayerName(layer); })));
  const int push = pushes_;
  NoteDrops(push);
  OFFLOAD_ASSIGN_OR_RETURN(SavedTensor saved, PushOne(tensor, push));
  pushes_ = push + 1;
  ProbeAtPush(push, tensor.storage->size_bytes());
  AfterPush(push);
  return saved;
}

StatusOr<SavedTensor> BudgetPolicy::Push(const CompositeTensor& tensor) {
  Busy busy(busy_);
  const bool enabled = options_.enabled;
  if (enabled) {
    OFFLOAD_RETURN_IF_ERROR(CheckPush("composite '" + tensor.name + "'"));
  }
  const int layer = enabled ? open_layer_ : -1;
  const int push = pushes_;
  // Every component goes through PushOne, which decides per unit.
  CompositePush composite;
  composite.slot = layer;
  composite.offloaded = enabled;
  composite.min_elements = options_.min_offload_elements;
  composite.where = [layer] { return "Push in " + LayerName(layer); };
  composite.push_one = [this, push](const Tensor& t) {
    return PushOne(t, push);
  };
  // All or nothing: a component that fails takes the earlier ones out.
  std::vector<Unit> units_before;
  std::vector<int> sizes_before;
  const bool diverged_before = diverged_;
  if (enabled) {
    composite.before_push = [&] {
      NoteDrops(push);
      units_before = units_;
      for (const auto& group : groups_) {
        sizes_before.push_back(group ? group->size() : 0);
      }
    };
  }
  composite.undo = [&] {
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g] == nullptr) continue;
      const int before = g < sizes_before.size() ? sizes_before[g] : 0;
      if (groups_[g]->state() == GroupState::kNotOffloaded) {
        groups_[g]->Truncate(before);
      }
    }
    groups_.resize(std::min(groups_.size(), sizes_before.size()));
    units_ = units_before;
    diverged_ = diverged_before;
  };
  OFFLOAD_ASSIGN_OR_RETURN(
      SavedTensor saved,
      PushComposite(tensor, composite, handles_, core_.backend(),
                    core_.stats()));
  if (enabled) {
    pushes_ = push + 1;
    std::vector<const Storage*> storages;
    int64_t bytes = 0;
    for (const std::optional<Tensor>& c : tensor.components) {
      if (!c.has_value() || c->storage == nullptr) continue;
      if (std::find(storages.begin(), storages.end(), c->storage.get()) ==
          storages.end()) {
        storages.push_back(c->storage.get());
        bytes += c->storage->size_bytes();
      }
    }
    ProbeAtPush(push, bytes);
    AfterPush(push);
  }
  return saved;
}

void BudgetPolicy::ProbeAtPush(int push, int64_t pushed_bytes) {
  if (probe_ == nullptr || plan_.has_value()) return;
  const int64_t engine = ResidentNow();
  if (push == 0) {
    // Everything allocated since the forward began counts, the first pushed
    // tensor too (as the engine's or, kept, as outside). Whether that tensor
    // was allocated before the first ForwardStep is not known: counted as
    // if after it (the larger outside bytes, never fewer than the truth).
    const int64_t now = probe_->InUseBytes();
    probe_base_ = std::min(probe_start_.value_or(now), now) - pushed_bytes;
    const int64_t peak = probe_->TakePeakBytes() - probe_base_;
    forward_outside_.assign(1, std::max<int64_t>(0, peak - engine));
  } else {
    const int64_t peak = probe_->TakePeakBytes() - probe_base_;
    forward_outside_.resize(push + 1, 0);
    forward_outside_[push] = std::max<int64_t>(0, peak - engine);
  }
  interval_engine_ = engine;
}

void BudgetPolicy::ProbeAtCall(int call) {
  if (probe_ == nullptr || plan_.has_value() || forward_outside_.empty()) {
    return;
  }
  // The engine's bytes only fall between two backward calls (units the
  // caller drops; nothing is pushed): against the fewer, at this call's
  // start, the outside bytes are never undercounted, wherever in the
  // interval the peak came.
  const int64_t engine = ResidentNow();
  const int64_t outside = std::max<int64_t>(
      0, probe_->TakePeakBytes() - probe_base_ -
             std::min(interval_engine_, engine));
  if (call == 0) {
    // Since the last push: next to the units resident at its end.
    forward_outside_.back() = std::max(forward_outside_.back(), outside);
  } else {
    if (static_cast<int>(backward_outside_.size()) < call) {
      backward_outside_.resize(call, 0);
    }
    backward_outside_[call - 1] =
        std::max(backward_outside_[call - 1], outside);
  }
  interval_engine_ = engine;
}

}  // namespace offload
