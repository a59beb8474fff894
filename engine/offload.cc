// The layer front door: TE's policy of when each layer's group moves
// (default k-of-n, a schedule table, or manual calls), on the shared
// mechanism of engine/core.

#include "engine/offload.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/group_key.h"
#include "engine/core/offload_core.h"
#include "engine/core/offload_group.h"

namespace offload {
namespace {

std::string LayerName(int layer) { return "layer " + std::to_string(layer); }

// SPEC §1.2: what is never offloaded.
bool NeverOffloaded(const Tensor& tensor, int64_t min_elements) {
  return tensor.flags.parameter || tensor.flags.weight ||
         tensor.flags.do_not_offload ||
         tensor.storage->space() != MemorySpace::kDevice ||
         tensor.numel() < min_elements;
}

void Merge(Status& first, const Status& status) {
  if (first.ok() && !status.ok()) first = status;
}

}  // namespace

class Offloader::Impl {
 public:
  Impl(Backend& backend, const OffloadOptions& options, ScheduleTable schedule,
       Stream& d2h, Stream& h2d)
      : options_(options),
        schedule_(std::move(schedule)),
        core_(backend, d2h, h2d,
              CoreOptions{options.min_span_coverage, options.skip_sparse_views,
                          options.warnings_to_stderr}) {
    const int n = options_.model_layers;
    // Groups are made when a layer first pushes into one (a disabled or
    // mostly kept-on-device stack costs nothing per layer).
    groups_.resize(options_.enabled ? n : 0);
    backward_begun_.assign(options_.enabled ? n : 0, false);
    for (const auto& [layer, entry] : schedule_) {
      release_at_[ScheduleStep(n, entry.offload_fwd, entry.offload_num)]
          .push_back(layer);
      reload_at_[ScheduleStep(n, entry.reload_fwd, entry.reload_num)]
          .push_back(layer);
    }
  }

  StatusOr<int> ForwardStep();
  Status BackwardStep(int layer);
  Status FinishBackward();
  StatusOr<SavedTensor> Push(const Tensor& tensor);
  StatusOr<SavedTensor> Push(const CompositeTensor& tensor);
  StatusOr<Tensor> Pop(const SavedTensor& saved);
  StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved);
  Status Manual(const char* call, int layer);

  bool WillOffload(int layer) const {
    if (!options_.enabled || layer < 0 || layer >= options_.model_layers) {
      return false;
    }
    return options_.manual_synchronization || schedule_.count(layer) > 0;
  }
  GroupState state(int layer) const {
    if (layer < 0 || layer >= options_.model_layers) {
      return GroupState::kNotOffloaded;
    }
    const OffloadGroup* group = FindGroup(layer);
    return group != nullptr ? group->state() : GroupState::kNotOffloaded;
  }
  int64_t OffloadedBytes() const {
    int64_t total = core_.pinned().bytes();
    for (const auto& group : groups_) {
      if (group != nullptr) total += group->host_bytes();
    }
    return total;
  }
  const ScheduleTable& schedule() const { return schedule_; }
  OffloadCore& core() { return core_; }
  const OffloadCore& core() const { return core_; }

 private:
  std::string Iteration() const {
    return "iteration " + std::to_string(iteration_);
  }
  Status CloseForward();
  Status RunStep(int step);
  Status CheckPush(const std::string& what) const;
  Status CheckHandle(const SavedTensor& saved, const char* call) const;
  StatusOr<SavedTensor> PushOne(const Tensor& tensor, int layer);
  StatusOr<Tensor> PopOne(const SavedTensor& saved);
  const OffloadGroup* FindGroup(int layer) const {
    if (layer < 0 || layer >= static_cast<int>(groups_.size())) return nullptr;
    return groups_[layer].get();
  }
  // The layer's group, made on first use. REQUIRES: 0 <= layer < n, enabled.
  OffloadGroup& Group(int layer) {
    std::unique_ptr<OffloadGroup>& group = groups_[layer];
    if (group == nullptr) {
      group = std::make_unique<OffloadGroup>(core_, GroupKey::Layer(layer),
                                             /*pinned_tag=*/layer);
    }
    return *group;
  }
  // Checks a tensor Push would hand to a group: well-formed, and its memory
  // and ready event belong to this backend (a foreign storage would be read
  // through another backend's address space: silent corruption).
  Status CheckOffloadable(const Tensor& tensor, const std::string& where) const;
  SavedTensor Kept(const Tensor& tensor, int layer) const {
    return SavedTensor(owner_, iteration_, layer, SavedTensor::Kept{tensor});
  }

  const OffloadOptions options_;
  const ScheduleTable schedule_;
  const uint64_t owner_ = NewSavedTensorOwnerId();
  OffloadCore core_;  // before groups_: they use it until destroyed
  std::vector<std::unique_ptr<OffloadGroup>> groups_;
  // The policy: which layers are released / start reloading at each step
  // (schedule.h: forward of the c-th layer is step c, backward n + c).
  std::map<int, std::vector<int>> release_at_;
  std::map<int, std::vector<int>> reload_at_;

  uint64_t iteration_ = 1;
  int forward_count_ = 0;   // layers whose forward began this iteration
  int backward_count_ = 0;  // layers whose backward began this iteration
  int open_layer_ = -1;     // the layer whose pushes are being collected
  int last_backward_ = -1;  // released when the next backward step begins
  std::vector<bool> backward_begun_;
};

// Ends the collection of the open layer's pushes; with automatic scheduling
// an offloaded layer starts its offload now. Idempotent.
Status Offloader::Impl::CloseForward() {
  if (open_layer_ < 0) return OkStatus();
  OffloadGroup& group = Group(open_layer_);
  if (!options_.manual_synchronization && WillOffload(open_layer_) &&
      group.state() == GroupState::kNotOffloaded) {
    OFFLOAD_RETURN_IF_ERROR(group.StartOffload(options_.retain_pinned_buffers));
  }
  open_layer_ = -1;
  return OkStatus();
}

// The releases and reloads the schedule puts at `step`. Each acts only on a
// group in the state before it, so a step retried after a failed reload
// does only what is left.
Status Offloader::Impl::RunStep(int step) {
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

StatusOr<int> Offloader::Impl::ForwardStep() {
  const int n = options_.model_layers;
  if (!options_.enabled) return forward_count_++ % n;
  if (backward_count_ > 0) {
    return FailedPreconditionError(
        "ForwardStep in " + Iteration() + ": the backward pass began; "
        "call FinishBackward before the next forward");
  }
  if (forward_count_ == n) {
    return FailedPreconditionError(
        "ForwardStep in " + Iteration() + ": all " + std::to_string(n) +
        " layers already ran forward; call BackwardStep and FinishBackward "
        "first");
  }
  const int layer = forward_count_;
  const std::string where = "ForwardStep to " + LayerName(layer);
  OFFLOAD_RETURN_IF_ERROR(CloseForward().WithContext(where));
  OFFLOAD_RETURN_IF_ERROR(
      RunStep(ScheduleStep(n, true, layer + 1)).WithContext(where));
  forward_count_ = layer + 1;
  open_layer_ = layer;
  return layer;
}

Status Offloader::Impl::BackwardStep(int layer) {
  const int n = options_.model_layers;
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "BackwardStep(" + LayerName(layer) + ") in " + Iteration();
  if (layer < 0 || layer >= n) {
    return InvalidArgumentError(where + ": no such layer in a model of " +
                                std::to_string(n) + " layers");
  }
  if (layer >= forward_count_) {
    return FailedPreconditionError(
        where + ": its forward has not run (" +
        std::to_string(forward_count_) + " layers ran forward)");
  }
  if (backward_begun_[layer]) {
    return FailedPreconditionError(where + ": its backward already began");
  }
  OFFLOAD_RETURN_IF_ERROR(CloseForward().WithContext(where));
  // The previous backward layer is done: drop its memory. Once released it
  // stays so, even if an ordering call failed (its memory is then kept).
  if (last_backward_ >= 0) {
    OffloadGroup& previous = Group(last_backward_);
    if (previous.state() != GroupState::kReleased) {
      OFFLOAD_RETURN_IF_ERROR(
          previous.ReleaseAll(options_.retain_pinned_buffers)
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

Status Offloader::Impl::FinishBackward() {
  if (!options_.enabled) {
    forward_count_ = 0;
    return OkStatus();
  }
  if (backward_count_ == 0) {
    return FailedPreconditionError("FinishBackward in " + Iteration() +
                                   ": no backward step was taken");
  }
  // The iteration ends whatever fails here; memory whose free could not be
  // ordered is kept (warned) and the first such error returned.
  Status first = OkStatus();
  open_layer_ = -1;
  for (auto& group : groups_) {
    if (group == nullptr) continue;
    if (group->state() != GroupState::kReleased) {
      Merge(first, group->ReleaseAll(options_.retain_pinned_buffers));
    }
    group->BeginIteration();
  }
  Merge(first, core_.RetryKept());
  iteration_++;
  forward_count_ = 0;
  backward_count_ = 0;
  last_backward_ = -1;
  backward_begun_.assign(options_.model_layers, false);
  return first.WithContext("FinishBackward (the iteration ended)");
}

Status Offloader::Impl::CheckPush(const std::string& what) const {
  if (open_layer_ >= 0) return OkStatus();
  std::string why =
      forward_count_ == 0
          ? "no ForwardStep yet in " + Iteration()
          : "the forward of " + LayerName(forward_count_ - 1) +
                " was closed (by StartOffload or a BackwardStep)";
  return FailedPreconditionError("Push of " + what +
                                 ": no layer's forward is open: " + why);
}

StatusOr<SavedTensor> Offloader::Impl::PushOne(const Tensor& tensor,
                                               int layer) {
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    ++core_.stats().tensors_kept;
    return Kept(tensor, layer);
  }
  OffloadGroup& group = Group(layer);
  std::shared_ptr<Event> ready = tensor.ready;
  const bool from_push = ready == nullptr;
  if (from_push) {
    OFFLOAD_ASSIGN_OR_RETURN(ready, group.NextPushEvent());
    OFFLOAD_RETURN_IF_ERROR(core_.compute().Record(*ready));
  }
  const int index = group.Add(tensor, std::move(ready), from_push);
  ++core_.stats().tensors_offloaded;
  return SavedTensor(owner_, iteration_, layer,
                     SavedTensor::InGroup{layer, index});
}

StatusOr<SavedTensor> Offloader::Impl::Push(const Tensor& tensor) {
  if (!options_.enabled) return Kept(tensor, -1);
  OFFLOAD_RETURN_IF_ERROR(CheckPush("tensor " + tensor.Describe()));
  const int layer = open_layer_;
  // SPEC §4.4: no processing at all for layers that are not offloaded.
  if (!WillOffload(layer)) return Kept(tensor, layer);
  OFFLOAD_RETURN_IF_ERROR(
      CheckOffloadable(tensor, "Push in " + LayerName(layer)));
  return PushOne(tensor, layer);
}

Status Offloader::Impl::CheckOffloadable(const Tensor& tensor,
                                         const std::string& where) const {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor).WithContext(where));
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    return OkStatus();  // handed back untouched
  }
  if (tensor.storage->backend() != &core_.backend()) {
    return InvalidArgumentError(where + ": tensor " + tensor.Describe() +
                                ": its storage belongs to another backend");
  }
  if (tensor.ready != nullptr && !core_.backend().Owns(*tensor.ready)) {
    return InvalidArgumentError(where + ": tensor " + tensor.Describe() +
                                ": its ready event belongs to another "
                                "backend");
  }
  return OkStatus();
}

StatusOr<SavedTensor> Offloader::Impl::Push(const CompositeTensor& tensor) {
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
      OFFLOAD_RETURN_IF_ERROR(CheckOffloadable(
          *tensor.components[i], "Push in " + LayerName(layer) +
                                     " of composite '" + tensor.name +
                                     "' component " + std::to_string(i)));
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

Status Offloader::Impl::CheckHandle(const SavedTensor& saved,
                                    const char* call) const {
  if (saved.owner() == 0) {
    return InvalidArgumentError(std::string(call) +
                                ": an empty SavedTensor (not from Push)");
  }
  if (saved.owner() != owner_) {
    return InvalidArgumentError(std::string(call) +
                                ": the SavedTensor belongs to another "
                                "Offloader");
  }
  if (options_.enabled && saved.iteration() != iteration_) {
    return InvalidArgumentError(
        std::string(call) + ": the SavedTensor was pushed in iteration " +
        std::to_string(saved.iteration()) + ", this is " + Iteration());
  }
  return OkStatus();
}

StatusOr<Tensor> Offloader::Impl::PopOne(const SavedTensor& saved) {
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

StatusOr<Tensor> Offloader::Impl::Pop(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "Pop"));
  if (const SavedTensor::Composite* composite = saved.composite()) {
    return InvalidArgumentError("Pop of composite '" + composite->name +
                                "': use PopComposite");
  }
  return PopOne(saved);
}

StatusOr<CompositeTensor> Offloader::Impl::PopComposite(
    const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "PopComposite"));
  const SavedTensor::Composite* composite = saved.composite();
  if (composite == nullptr) {
    return InvalidArgumentError("PopComposite of a plain tensor: use Pop");
  }
  CompositeTensor tensor;
  tensor.name = composite->name;
  tensor.metadata = composite->metadata;
  for (const std::optional<SavedTensor>& component : composite->components) {
    if (!component.has_value()) {
      tensor.components.emplace_back();
      continue;
    }
    OFFLOAD_ASSIGN_OR_RETURN(Tensor part, PopOne(*component));
    tensor.components.emplace_back(std::move(part));
  }
  return tensor;
}

Status Offloader::Impl::Manual(const char* call, int layer) {
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
  if (name == "StartOffload") {
    OFFLOAD_RETURN_IF_ERROR(group.StartOffload(options_.retain_pinned_buffers));
    if (open_layer_ == layer) open_layer_ = -1;  // closed
    return OkStatus();
  }
  if (name == "ReleaseForwardMemory") return group.ReleaseForwardMemory();
  return group.StartReload();
}

// ---------------------------------------------------------------------------
// The public class forwards to Impl.

Offloader::Offloader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// Groups go first (Impl's member order), each freeing its memory ordered
// after the copies that use it; then the core returns pooled and kept
// memory the same way.
Offloader::~Offloader() = default;

StatusOr<std::unique_ptr<Offloader>> Offloader::Create(
    Backend& backend, const OffloadOptions& options) {
  auto invalid = [](const std::string& why) {
    return InvalidArgumentError("Offloader options: " + why);
  };
  if (options.model_layers < 1) {
    return invalid("model_layers must be at least 1, got " +
                   std::to_string(options.model_layers));
  }
  if (options.model_layers > kMaxModelLayers) {
    return invalid("model_layers must be at most " +
                   std::to_string(kMaxModelLayers) + ", got " +
                   std::to_string(options.model_layers));
  }
  if (options.offload_stream != nullptr &&
      !backend.Owns(*options.offload_stream)) {
    return invalid("offload_stream belongs to another backend");
  }
  if (options.min_offload_elements < 0) {
    return invalid("min_offload_elements must not be negative");
  }
  if (!(options.min_span_coverage >= 0.0 && options.min_span_coverage <= 1.0)) {
    return invalid("min_span_coverage must be in [0, 1]");
  }
  if (options.offload_stream != nullptr && !options.manual_synchronization) {
    return invalid("a custom offload_stream needs manual_synchronization");
  }
  if (options.schedule.has_value() && options.manual_synchronization) {
    return invalid("a schedule table and manual_synchronization exclude each "
                   "other");
  }
  ScheduleTable schedule;
  bool warn_no_overlap = false;
  if (options.enabled && !options.manual_synchronization) {
    if (options.schedule.has_value()) {
      OFFLOAD_RETURN_IF_ERROR(
          ValidateSchedule(*options.schedule, options.model_layers)
              .WithContext("Offloader options"));
      schedule = *options.schedule;
    } else {
      StatusOr<ScheduleTable> table =
          DefaultSchedule(options.model_layers, options.offloaded_layers);
      if (!table.ok()) return table.status().WithContext("Offloader options");
      schedule = std::move(table).value();
      warn_no_overlap = options.offloaded_layers > 0 &&
                        options.offloaded_layers == options.model_layers - 1;
    }
  }
  // Disabled: no copy stream is made (the core is given the compute stream
  // and never copies).
  Stream* d2h = &backend.ComputeStream();
  Stream* h2d = d2h;
  if (options.enabled) {
    if (options.offload_stream != nullptr) {
      d2h = h2d = options.offload_stream;
    } else {
      OFFLOAD_ASSIGN_OR_RETURN(d2h, backend.NewStream("offload_d2h"));
      OFFLOAD_ASSIGN_OR_RETURN(h2d, backend.NewStream("offload_h2d"));
    }
  }
  auto impl = std::make_unique<Impl>(backend, options, std::move(schedule),
                                     *d2h, *h2d);
  if (warn_no_overlap) {
    impl->core().Warn(
        "offloading " + std::to_string(options.offloaded_layers) + " of " +
        std::to_string(options.model_layers) +
        " layers leaves one layer's activations on device: compute and "
        "copies cannot overlap; offload at most model_layers - 2 for overlap");
  }
  return std::unique_ptr<Offloader>(new Offloader(std::move(impl)));
}

StatusOr<int> Offloader::ForwardStep() { return impl_->ForwardStep(); }
Status Offloader::BackwardStep(int layer) { return impl_->BackwardStep(layer); }
Status Offloader::FinishBackward() { return impl_->FinishBackward(); }
StatusOr<SavedTensor> Offloader::Push(const Tensor& tensor) {
  return impl_->Push(tensor);
}
StatusOr<SavedTensor> Offloader::Push(const CompositeTensor& tensor) {
  return impl_->Push(tensor);
}
StatusOr<Tensor> Offloader::Pop(const SavedTensor& saved) {
  return impl_->Pop(saved);
}
StatusOr<CompositeTensor> Offloader::PopComposite(const SavedTensor& saved) {
  return impl_->PopComposite(saved);
}
Status Offloader::StartOffload(int layer) {
  return impl_->Manual("StartOffload", layer);
}
Status Offloader::ReleaseForwardMemory(int layer) {
  return impl_->Manual("ReleaseForwardMemory", layer);
}
Status Offloader::StartReload(int layer) {
  return impl_->Manual("StartReload", layer);
}
int64_t Offloader::OffloadedBytes() const { return impl_->OffloadedBytes(); }
const Diagnostics& Offloader::diagnostics() const {
  return impl_->core().diagnostics();
}
GroupState Offloader::state(int layer) const { return impl_->state(layer); }
const OffloaderStats& Offloader::stats() const { return impl_->core().stats(); }
const ScheduleTable& Offloader::schedule() const { return impl_->schedule(); }
bool Offloader::WillOffload(int layer) const {
  return impl_->WillOffload(layer);
}

}  // namespace offload
