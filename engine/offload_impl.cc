// The layer policy: when each layer's group moves (default k-of-n, a
// schedule table, or manual calls), and the push/pop hooks.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/push_checks.h"
#include "engine/layer_steps.h"
#include "engine/offload_impl.h"

namespace offload {
namespace {

std::string LayerName(int layer) { return "layer " + std::to_string(layer); }

}  // namespace

// Ends the collection of the open layer's pushes; with automatic scheduling
// an offloaded layer starts its offload now. Idempotent.
Status Offloader::LayerPolicy::CloseForward() {
  if (open_layer_ < 0) return OkStatus();
  OffloadGroup& group = Group(open_layer_);
  if (!options_.manual_synchronization && WillOffload(open_layer_) &&
      group.state() == GroupState::kNotOffloaded) {
    if (warmup_) {
      RecordWarmupNeeds(open_layer_);
    } else {
      OFFLOAD_RETURN_IF_ERROR(group.StartOffload(retain_pinned_));
      CheckCapturedOffload(open_layer_);
    }
  }
  open_layer_ = -1;
  return OkStatus();
}

// The releases and reloads the schedule puts at `step`. Each acts only on a
// group in the state before it, so a step retried after a failed reload
// does only what is left.
Status Offloader::LayerPolicy::RunStep(int step) {
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

StatusOr<int> Offloader::LayerPolicy::ForwardStep() {
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

Status Offloader::LayerPolicy::BackwardStep(int layer) {
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
    if (previous.state() != GroupState::kReleased) {
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

Status Offloader::LayerPolicy::FinishBackward() {
  if (!options_.enabled) {
    forward_count_ = 0;
    return OkStatus();
  }
  OFFLOAD_RETURN_IF_ERROR(CheckFinishBackward(Iteration(), backward_count_));
  // The iteration ends whatever fails here; memory whose free could not be
  // ordered is kept (warned) and the first such error returned.
  open_layer_ = -1;
  Status first =
      EndIteration(core_, groups_, retain_pinned_);
  iteration_++;
  forward_count_ = 0;
  backward_count_ = 0;
  last_backward_ = -1;
  backward_begun_.assign(options_.model_layers, false);
  return first.WithContext("FinishBackward (the iteration ended)");
}

Status Offloader::LayerPolicy::CheckPush(const std::string& what) const {
  if (open_layer_ >= 0) return OkStatus();
  std::string why =
      forward_count_ == 0
          ? "no ForwardStep yet in " + Iteration()
          : "the forward of " + LayerName(forward_count_ - 1) +
                " was closed (by StartOffload or a BackwardStep)";
  return FailedPreconditionError("Push of " + what +
                                 ": no layer's forward is open: " + why);
}

StatusOr<SavedTensor> Offloader::LayerPolicy::PushOne(const Tensor& tensor,
                                               int layer) {
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    ++core_.stats().tensors_kept;
    return Kept(tensor, layer);
  }
  OFFLOAD_ASSIGN_OR_RETURN(const int index, Group(layer).AddPushed(tensor));
  if (!warmup_) ++core_.stats().tensors_offloaded;
  return SavedTensor(owner_, iteration_, layer,
                     SavedTensor::InGroup{layer, index});
}

StatusOr<SavedTensor> Offloader::LayerPolicy::Push(const Tensor& tensor) {
  if (!options_.enabled) return Kept(tensor, -1);
  if (open_layer_ < 0) return CheckPush("tensor " + tensor.Describe());
  const int layer = open_layer_;
  // SPEC §4.4: no processing at all for layers that are not offloaded.
  if (!WillOffload(layer)) return Kept(tensor, layer);
  OFFLOAD_RETURN_IF_ERROR(CheckOffloadable(
      tensor, [layer] { return "Push in " + LayerName(layer); }));
  return PushOne(tensor, layer);
}

Status Offloader::LayerPolicy::CheckOffloadable(const Tensor& tensor,
                                                const WhereFn& where) const {
  return offload::CheckOffloadable(tensor, core_.backend(),
                                   options_.min_offload_elements, where);
}

StatusOr<SavedTensor> Offloader::LayerPolicy::Push(const CompositeTensor& tensor) {
  const bool enabled = options_.enabled;
  if (enabled) {
    OFFLOAD_RETURN_IF_ERROR(CheckPush("composite '" + tensor.name + "'"));
  }
  const int layer = enabled ? open_layer_ : -1;
  const bool offloaded = enabled && WillOffload(layer);
  // Check every component before touching anything: a failed push adds
  // nothing to the group.
  if (offloaded) {
    for (size_t i = 0; i < tensor.components.size(); ++i) {
      if (!tensor.components[i].has_value()) continue;
      OFFLOAD_RETURN_IF_ERROR(CheckOffloadable(*tensor.components[i], [&] {
        return "Push in " + LayerName(layer) + " of composite '" +
               tensor.name + "' component " + std::to_string(i);
      }));
    }
  }
  // All or nothing: a component that fails to push (its ready point could
  // not be recorded) takes the earlier ones out of the group again.
  const int group_size = offloaded ? Group(layer).size() : 0;
  const OffloaderStats stats_before = core_.stats();
  SavedTensor::Composite composite{{}, tensor.metadata, tensor.name};
  for (const std::optional<Tensor>& component : tensor.components) {
    if (!component.has_value()) {
      composite.components.emplace_back();
    } else if (!offloaded) {
      composite.components.emplace_back(Kept(*component, layer));
    } else {
      StatusOr<SavedTensor> part = PushOne(*component, layer);
      if (!part.ok()) {
        Group(layer).Truncate(group_size);
        core_.stats() = stats_before;
        return part.status().WithContext("Push of composite '" + tensor.name +
                                         "' (no component was pushed)");
      }
      composite.components.emplace_back(std::move(part).value());
    }
  }
  return SavedTensor(owner_, iteration_, layer, std::move(composite));
}

Status Offloader::LayerPolicy::CheckHandle(const SavedTensor& saved,
                                    const char* call) const {
  return offload::CheckHandle(saved, owner_, iteration_, options_.enabled,
                              call, "Offloader");
}

StatusOr<Tensor> Offloader::LayerPolicy::PopOne(const SavedTensor& saved) {
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
  return groups_[entry->group]->Pop(entry->index);
}

StatusOr<Tensor> Offloader::LayerPolicy::Pop(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "Pop"));
  return PopPlain(saved, [this](const SavedTensor& s) { return PopOne(s); });
}

StatusOr<CompositeTensor> Offloader::LayerPolicy::PopComposite(
    const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "PopComposite"));
  return offload::PopComposite(
      saved, [this](const SavedTensor& s) { return PopOne(s); });
}

Status Offloader::LayerPolicy::Manual(const char* call, int layer) {
  if (!options_.enabled) return OkStatus();
  const std::string where = std::string(call) + "(" + LayerName(layer) + ")";
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
  const std::string name = call;
  if (name == "StartOffload" && backward_begun_[layer]) {
    return FailedPreconditionError(where + ": its backward already began in " +
                                   Iteration());
  }
  if (warmup_) {  // nothing moves; StartOffload records what it would take
    if (name == "StartOffload" && group.state() == GroupState::kNotOffloaded) {
      RecordWarmupNeeds(layer);
      if (open_layer_ == layer) open_layer_ = -1;  // closed
    }
    return OkStatus();
  }
  if (name == "StartOffload") {
    OFFLOAD_RETURN_IF_ERROR(group.StartOffload(retain_pinned_));
    CheckCapturedOffload(layer);
    if (open_layer_ == layer) open_layer_ = -1;  // closed
    return OkStatus();
  }
  if (name == "ReleaseForwardMemory") return group.ReleaseForwardMemory();
  return group.StartReload();
}

}  // namespace offload
