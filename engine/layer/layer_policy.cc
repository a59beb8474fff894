// The layer policy: when each layer's group moves (default k-of-n, a
// schedule table, or manual calls), and the push/pop hooks.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/layer/layer_policy.h"

#include "engine/core/push_checks.h"
#include "engine/policy/layer_steps.h"

namespace offload {

// Ends the collection of the open layer's pushes; with automatic scheduling
// an offloaded layer starts its offload now. Idempotent.
Status LayerPolicy::CloseForward() {
  if (open_layer_ < 0) return OkStatus();
  OffloadGroup& group = Group(open_layer_);
  if (!options_.manual_synchronization && WillOffload(open_layer_) &&
      group.state() == GroupState::kNotOffloaded) {
    if (warmup_) {
      RecordWarmupNeeds(open_layer_);
    } else {
      Status started = group.StartOffload(retain_pinned_);
      if (!started.ok()) {
        // A refused retained shape (SPEC §3.5) kept it on device: closed.
        if (group.state() == GroupState::kKeptOnDevice) open_layer_ = -1;
        return started;
      }
      CheckCapturedOffload(open_layer_);
    }
  }
  open_layer_ = -1;
  return OkStatus();
}

// The releases and reloads the schedule puts at `step`. Each acts only on a
// group in the state before it, so a step retried after a failed reload
// does only what is left.
Status LayerPolicy::RunStep(int step) {
  if (auto it = release_at_.find(step); it != release_at_.end()) {
    for (int layer : it->second) {
      OffloadGroup& group = Group(layer);
      if (group.state() == GroupState::kOffloadStarted) {
        OFFLOAD_RETURN_IF_ERROR(group.ReleaseForwardMemory());
      }
    }
  }
  if (auto it = reload_at_.find(step); it != reload_at_.end()) {
    for (int layer : it->second) {
      OffloadGroup& group = Group(layer);
      if (group.state() == GroupState::kOffloadFinished) {
        OFFLOAD_RETURN_IF_ERROR(group.StartReload());
      }
    }
  }
  return OkStatus();
}

StatusOr<int> LayerPolicy::ForwardStep() {
  const int n = options_.model_layers;
  if (!options_.enabled) return forward_count_++ % n;
  OFFLOAD_RETURN_IF_ERROR(
      CheckForwardStep(Iteration(), n, forward_count_, backward_count_));
  const int layer = forward_count_;
  const std::string where = "ForwardStep to " + LayerName(layer);
  OFFLOAD_RETURN_IF_ERROR(CloseForward().WithContext(where));
  OFFLOAD_RETURN_IF_ERROR(
      RunStep(ScheduleStep(n, true, layer + 1)).WithContext(where));
  forward_count_ = layer + 1;
  open_layer_ = layer;
  return layer;
}

Status LayerPolicy::BackwardStep(int layer) {
  const int n = options_.model_layers;
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "BackwardStep(" + LayerName(layer) + ") in " + Iteration();
  OFFLOAD_RETURN_IF_ERROR(
      CheckBackwardStep(where, layer, n, forward_count_, backward_begun_));
  OFFLOAD_RETURN_IF_ERROR(CloseForward().WithContext(where));
  // The previous backward layer is done: drop its memory. Once released it
  // stays so, even if an ordering call failed (its memory is then kept).
  if (last_backward_ >= 0) {
    OffloadGroup& previous = Group(last_backward_);
    if (options_.keep_host_copies) {
      // SPEC §7.3: its host copy stays for a later traversal.
      OFFLOAD_RETURN_IF_ERROR(previous.DropReloaded().WithContext(where));
    } else if (previous.state() != GroupState::kReleased) {
      OFFLOAD_RETURN_IF_ERROR(
          previous.ReleaseAll(retain_pinned_)
              .WithContext(where));
    }
  }
  OFFLOAD_RETURN_IF_ERROR(
      RunStep(ScheduleStep(n, false, backward_count_ + 1)).WithContext(where));
  backward_begun_[layer] = true;
  backward_count_++;
  last_backward_ = layer;
  return OkStatus();
}

Status LayerPolicy::FinishBackward() {
  if (!options_.enabled) {
    forward_count_ = 0;
    return OkStatus();
  }
  // After EndTraversal the iteration may end without another step.
  if (traversals_ == 0) {
    OFFLOAD_RETURN_IF_ERROR(CheckFinishBackward(Iteration(), backward_count_));
  }
  // The iteration ends whatever fails here; memory whose free could not be
  // ordered is kept (warned) and the first such error returned.
  return EndThisIteration().WithContext("FinishBackward (the iteration ended)");
}

Status LayerPolicy::EndThisIteration() {
  open_layer_ = -1;
  Status first = EndIteration(core_, groups_, retain_pinned_);
  handles_.NextIteration();
  forward_count_ = 0;
  backward_count_ = 0;
  last_backward_ = -1;
  traversals_ = 0;
  backward_begun_.assign(options_.model_layers, false);
  return first;
}

Status LayerPolicy::AbandonIteration() {
  if (!options_.enabled) {
    forward_count_ = 0;
    return OkStatus();
  }
  const std::string where = "AbandonIteration of " + Iteration();
  if (warmup_ || capturing_) {
    return FailedPreconditionError(
        where + ": not during a " +
        std::string(capturing_ ? "graph capture" : "warm-up") +
        " (finish the iteration: FinishBackward)");
  }
  if (forward_count_ == 0) return OkStatus();  // between iterations
  // A forward that offloaded nothing (every tensor under the size
  // threshold, or no layer offloaded) holds no memory of ours: dropping it
  // releases nothing, so nothing is said (a tiny model's every step).
  if (AnyPushed(groups_)) {
    core_.Warn(where + ": dropped after " + std::to_string(forward_count_) +
               " of " + std::to_string(options_.model_layers) +
               " layers' forward and " + std::to_string(backward_count_) +
               " layers' backward (" + std::to_string(traversals_) +
               " earlier backward passes); its memory was released");
  }
  return EndThisIteration().WithContext(where + " (the iteration ended)");
}

Status LayerPolicy::EndTraversal() {
  if (!options_.enabled) return OkStatus();
  const std::string where = "EndTraversal of " + Iteration();
  OFFLOAD_RETURN_IF_ERROR(CheckEndTraversal(where, options_.keep_host_copies,
                                            backward_count_, traversals_));
  Status first = offload::EndTraversal(core_, groups_);
  backward_count_ = 0;
  last_backward_ = -1;
  backward_begun_.assign(options_.model_layers, false);
  ++traversals_;
  return first.WithContext(where);
}

Status LayerPolicy::CheckPush(const std::string& what) const {
  if (open_layer_ >= 0) return OkStatus();
  std::string why =
      forward_count_ == 0
          ? "no ForwardStep yet in " + Iteration()
          : "the forward of " + LayerName(forward_count_ - 1) +
                " was closed (by StartOffload or a BackwardStep)";
  return FailedPreconditionError("Push of " + what +
                                 ": no layer's forward is open: " + why);
}

StatusOr<SavedTensor> LayerPolicy::PushOne(const Tensor& tensor,
                                               int layer) {
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    ++core_.stats().tensors_kept;
    return handles_.Kept(tensor, layer);
  }
  OFFLOAD_ASSIGN_OR_RETURN(const int index, Group(layer).AddPushed(tensor));
  if (!warmup_) ++core_.stats().tensors_offloaded;
  return handles_.InGroup(layer, layer, index);
}

StatusOr<SavedTensor> LayerPolicy::Push(const Tensor& tensor) {
  if (!options_.enabled) return handles_.Kept(tensor, -1);
  if (open_layer_ < 0) return CheckPush("tensor " + tensor.Describe());
  const int layer = open_layer_;
  // SPEC §4.4: no processing at all for layers that are not offloaded.
  if (!WillOffload(layer)) return handles_.Kept(tensor, layer);
  OFFLOAD_RETURN_IF_ERROR(CheckOffloadable(
      tensor, [layer] { return "Push in " + LayerName(layer); }));
  return PushOne(tensor, layer);
}

Status LayerPolicy::CheckOffloadable(const Tensor& tensor,
                                                const WhereFn& where) const {
  return offload::CheckOffloadable(tensor, core_.backend(),
                                   options_.min_offload_elements, where);
}

StatusOr<SavedTensor> LayerPolicy::Push(const CompositeTensor& tensor) {
  const bool enabled = options_.enabled;
  if (enabled) {
    OFFLOAD_RETURN_IF_ERROR(CheckPush("composite '" + tensor.name + "'"));
  }
  const int layer = enabled ? open_layer_ : -1;
  CompositePush push;
  push.slot = layer;
  push.offloaded = enabled && WillOffload(layer);
  push.min_elements = options_.min_offload_elements;
  push.where = [layer] { return "Push in " + LayerName(layer); };
  push.push_one = [this, layer](const Tensor& t) { return PushOne(t, layer); };
  const int group_size = push.offloaded ? Group(layer).size() : 0;
  push.undo = [this, layer, group_size] { Group(layer).Truncate(group_size); };
  return PushComposite(tensor, push, handles_, core_.backend(), core_.stats());
}

Status LayerPolicy::CheckHandle(const SavedTensor& saved,
                                    const char* call) const {
  return handles_.Check(saved, options_.enabled, call);
}

StatusOr<Tensor> LayerPolicy::PopOne(const SavedTensor& saved) {
  if (const SavedTensor::Kept* kept = saved.kept()) return kept->tensor;
  const SavedTensor::InGroup* entry = saved.group_entry();
  if (entry == nullptr || entry->group < 0 ||
      entry->group >= static_cast<int>(groups_.size())) {
    return InvalidArgumentError("Pop: a malformed SavedTensor (no group " +
                                std::string(entry ? std::to_string(entry->group)
                                                  : "entry") + ")");
  }
  if (groups_[entry->group] == nullptr) {
    return InvalidArgumentError("Pop: a malformed SavedTensor (" +
                                LayerName(entry->group) + " has no group)");
  }
  OffloadGroup& group = *groups_[entry->group];
  // SPEC §7.3: a later traversal may reach a layer in another order than
  // the schedule's, or a pass pop a layer whose backward it already left;
  // its reload starts at its first pop.
  if (options_.keep_host_copies &&
      group.state() == GroupState::kOffloadFinished) {
    OFFLOAD_RETURN_IF_ERROR(group.StartReload());
  }
  return group.Pop(entry->index);
}

StatusOr<Tensor> LayerPolicy::Pop(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "Pop"));
  return PopPlain(saved, [this](const SavedTensor& s) { return PopOne(s); });
}

StatusOr<CompositeTensor> LayerPolicy::PopComposite(
    const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "PopComposite"));
  return offload::PopComposite(
      saved, [this](const SavedTensor& s) { return PopOne(s); });
}

Status LayerPolicy::Manual(ManualCall call, int layer) {
  if (!options_.enabled) return OkStatus();
  const std::string where =
      std::string(ManualCallName(call)) + "(" + LayerName(layer) + ")";
  if (!options_.manual_synchronization) {
    return FailedPreconditionError(
        where + ": only with manual_synchronization; otherwise the schedule "
                "decides when layers offload and reload");
  }
  if (layer < 0 || layer >= options_.model_layers) {
    return InvalidArgumentError(where + ": no such layer in a model of " +
                                std::to_string(options_.model_layers) +
                                " layers");
  }
  if (layer >= forward_count_) {
    return FailedPreconditionError(where + ": its forward has not begun in " +
                                   Iteration());
  }
  OffloadGroup& group = Group(layer);
  switch (call) {
    case ManualCall::kStartOffload: {
      if (backward_begun_[layer]) {
        return FailedPreconditionError(
            where + ": its backward already began in " + Iteration());
      }
      if (warmup_) {  // nothing moves; record what it would take
        if (group.state() == GroupState::kNotOffloaded) {
          RecordWarmupNeeds(layer);
          if (open_layer_ == layer) open_layer_ = -1;  // closed
        }
        return OkStatus();
      }
      // A refused retained shape (SPEC §3.5) keeps the group on device and
      // still closes the layer.
      Status started = group.StartOffload(retain_pinned_);
      if (!started.ok() && group.state() != GroupState::kKeptOnDevice) {
        return started;
      }
      if (started.ok()) CheckCapturedOffload(layer);
      if (open_layer_ == layer) open_layer_ = -1;  // closed
      return started;
    }
    case ManualCall::kReleaseForwardMemory:
      return warmup_ ? OkStatus() : group.ReleaseForwardMemory();
    case ManualCall::kStartReload:
      return warmup_ ? OkStatus() : group.StartReload();
  }
  return InvalidArgumentError(where + ": unknown manual call");
}

}  // namespace offload
