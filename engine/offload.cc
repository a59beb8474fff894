#include "engine/offload.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/group.h"

namespace offload {
namespace {

std::string LayerName(int layer) { return "layer " + std::to_string(layer); }

}  // namespace

struct Offloader::Impl {
  GroupContext ctx;
  std::vector<std::unique_ptr<Group>> groups;
  // Schedule: which layers are released / start reloading at each step
  // (schedule.h: forward of the c-th layer is step c, backward n + c).
  std::map<int, std::vector<int>> release_at;
  std::map<int, std::vector<int>> reload_at;

  uint64_t iteration = 1;
  int forward_count = 0;   // layers whose forward began this iteration
  int backward_count = 0;  // layers whose backward began this iteration
  int open_layer = -1;     // the layer whose pushes are being collected
  int last_backward = -1;  // released when the next backward step begins
  std::vector<bool> backward_begun;

  std::string Iteration() const {
    return "iteration " + std::to_string(iteration);
  }
};

Offloader::Offloader(Backend& backend, const OffloadOptions& options,
                     ScheduleTable schedule, Stream* d2h, Stream* h2d)
    : backend_(backend),
      options_(options),
      schedule_(std::move(schedule)),
      diagnostics_(options.warnings_to_stderr),
      impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  impl.ctx = GroupContext{&backend_, &backend_.ComputeStream(), d2h, h2d,
                          &options_, &diagnostics_, &stats_};
  for (int layer = 0; layer < options_.model_layers; ++layer) {
    impl.groups.push_back(std::make_unique<Group>(layer));
  }
  impl.backward_begun.assign(options_.model_layers, false);
  const int n = options_.model_layers;
  for (const auto& [layer, entry] : schedule_) {
    impl.release_at[ScheduleStep(n, entry.offload_fwd, entry.offload_num)]
        .push_back(layer);
    impl.reload_at[ScheduleStep(n, entry.reload_fwd, entry.reload_num)]
        .push_back(layer);
  }
}

Offloader::~Offloader() {
  // Whatever is in flight keeps its memory until the copies using it are
  // done: every free below is ordered after them.
  for (auto& group : impl_->groups) group->Shutdown(impl_->ctx);
}

StatusOr<std::unique_ptr<Offloader>> Offloader::Create(
    Backend& backend, const OffloadOptions& options) {
  auto invalid = [](const std::string& why) {
    return InvalidArgumentError("Offloader options: " + why);
  };
  if (options.model_layers < 1) {
    return invalid("model_layers must be at least 1, got " +
                   std::to_string(options.model_layers));
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
  Stream* d2h = nullptr;
  Stream* h2d = nullptr;
  if (options.enabled) {
    if (options.offload_stream != nullptr) {
      d2h = h2d = options.offload_stream;
    } else {
      OFFLOAD_ASSIGN_OR_RETURN(d2h, backend.NewStream("offload_d2h"));
      OFFLOAD_ASSIGN_OR_RETURN(h2d, backend.NewStream("offload_h2d"));
    }
  }
  std::unique_ptr<Offloader> offloader(
      new Offloader(backend, options, std::move(schedule), d2h, h2d));
  if (warn_no_overlap) {
    offloader->diagnostics_.Warn(
        "offloading " + std::to_string(options.offloaded_layers) + " of " +
        std::to_string(options.model_layers) +
        " layers leaves one layer's activations on device: compute and "
        "copies cannot overlap; offload at most model_layers - 2 for overlap");
  }
  return offloader;
}

bool Offloader::WillOffload(int layer) const {
  if (!options_.enabled || layer < 0 || layer >= options_.model_layers) {
    return false;
  }
  return options_.manual_synchronization || schedule_.count(layer) > 0;
}

GroupState Offloader::state(int layer) const {
  if (layer < 0 || layer >= options_.model_layers) {
    return GroupState::kNotOffloaded;
  }
  return impl_->groups[layer]->state();
}

int64_t Offloader::OffloadedBytes() const {
  int64_t total = 0;
  for (const auto& group : impl_->groups) total += group->host_bytes();
  return total;
}

// Ends the collection of the open layer's pushes; with automatic scheduling
// an offloaded layer starts its offload now. Idempotent.
static Status CloseForward(Offloader::Impl& impl, bool automatic,
                           bool offloaded) {
  if (impl.open_layer < 0) return OkStatus();
  Group& group = *impl.groups[impl.open_layer];
  if (automatic && offloaded && group.state() == GroupState::kNotOffloaded) {
    OFFLOAD_RETURN_IF_ERROR(group.StartOffload(impl.ctx));
  }
  impl.open_layer = -1;
  return OkStatus();
}

// The releases and reloads the schedule puts at `step`. Each acts only on a
// group in the state before it, so a step retried after a failed reload
// does only what is left.
static Status RunStep(Offloader::Impl& impl, int step) {
  if (auto it = impl.release_at.find(step); it != impl.release_at.end()) {
    for (int layer : it->second) {
      Group& group = *impl.groups[layer];
      if (group.state() == GroupState::kOffloadStarted) {
        OFFLOAD_RETURN_IF_ERROR(group.ReleaseForwardMemory(impl.ctx));
      }
    }
  }
  if (auto it = impl.reload_at.find(step); it != impl.reload_at.end()) {
    for (int layer : it->second) {
      Group& group = *impl.groups[layer];
      if (group.state() == GroupState::kOffloadFinished) {
        OFFLOAD_RETURN_IF_ERROR(group.StartReload(impl.ctx));
      }
    }
  }
  return OkStatus();
}

StatusOr<int> Offloader::ForwardStep() {
  Impl& impl = *impl_;
  const int n = options_.model_layers;
  if (!options_.enabled) return impl.forward_count++ % n;
  if (impl.backward_count > 0) {
    return FailedPreconditionError(
        "ForwardStep in " + impl.Iteration() + ": the backward pass began; "
        "call FinishBackward before the next forward");
  }
  if (impl.forward_count == n) {
    return FailedPreconditionError(
        "ForwardStep in " + impl.Iteration() + ": all " + std::to_string(n) +
        " layers already ran forward; call BackwardStep and FinishBackward "
        "first");
  }
  const int layer = impl.forward_count;
  bool automatic = !options_.manual_synchronization;
  if (impl.open_layer >= 0) {
    OFFLOAD_RETURN_IF_ERROR(
        CloseForward(impl, automatic, WillOffload(impl.open_layer))
            .WithContext("ForwardStep to " + LayerName(layer)));
  }
  OFFLOAD_RETURN_IF_ERROR(RunStep(impl, ScheduleStep(n, true, layer + 1))
                              .WithContext("ForwardStep to " + LayerName(layer)));
  impl.forward_count = layer + 1;
  impl.open_layer = layer;
  return layer;
}

Status Offloader::BackwardStep(int layer) {
  Impl& impl = *impl_;
  const int n = options_.model_layers;
  if (!options_.enabled) return OkStatus();
  std::string where = "BackwardStep(" + LayerName(layer) + ") in " +
                      impl.Iteration();
  if (layer < 0 || layer >= n) {
    return InvalidArgumentError(where + ": no such layer in a model of " +
                                std::to_string(n) + " layers");
  }
  if (layer >= impl.forward_count) {
    return FailedPreconditionError(
        where + ": its forward has not run (" +
        std::to_string(impl.forward_count) + " layers ran forward)");
  }
  if (impl.backward_begun[layer]) {
    return FailedPreconditionError(where + ": its backward already began");
  }
  bool automatic = !options_.manual_synchronization;
  if (impl.open_layer >= 0) {
    OFFLOAD_RETURN_IF_ERROR(
        CloseForward(impl, automatic, WillOffload(impl.open_layer))
            .WithContext(where));
  }
  // The previous backward layer is done: drop its memory.
  if (impl.last_backward >= 0) {
    Group& previous = *impl.groups[impl.last_backward];
    if (previous.state() != GroupState::kReleased) {
      previous.ReleaseAll(impl.ctx, options_.retain_pinned_buffers);
    }
  }
  OFFLOAD_RETURN_IF_ERROR(
      RunStep(impl, ScheduleStep(n, false, impl.backward_count + 1))
          .WithContext(where));
  impl.backward_begun[layer] = true;
  impl.backward_count++;
  impl.last_backward = layer;
  return OkStatus();
}

Status Offloader::FinishBackward() {
  Impl& impl = *impl_;
  if (!options_.enabled) {
    impl.forward_count = 0;
    return OkStatus();
  }
  if (impl.backward_count == 0) {
    return FailedPreconditionError("FinishBackward in " + impl.Iteration() +
                                   ": no backward step was taken");
  }
  impl.open_layer = -1;
  for (auto& group : impl.groups) {
    if (group->state() != GroupState::kReleased) {
      group->ReleaseAll(impl.ctx, options_.retain_pinned_buffers);
    }
    group->BeginIteration();
  }
  impl.iteration++;
  impl.forward_count = 0;
  impl.backward_count = 0;
  impl.last_backward = -1;
  impl.backward_begun.assign(options_.model_layers, false);
  return OkStatus();
}

namespace {

// SPEC §1.2: what is never offloaded.
bool NeverOffloaded(const Tensor& tensor, int64_t min_elements) {
  return tensor.flags.parameter || tensor.flags.weight ||
         tensor.flags.do_not_offload ||
         tensor.storage->space() != MemorySpace::kDevice ||
         tensor.numel() < min_elements;
}

}  // namespace

Status Offloader::CheckPush(const std::string& what) const {
  const Impl& impl = *impl_;
  if (impl.open_layer < 0) {
    std::string why =
        impl.forward_count == 0
            ? "no ForwardStep yet in " + impl.Iteration()
            : "the forward of " + LayerName(impl.forward_count - 1) +
                  " was closed (by StartOffload or a BackwardStep)";
    return FailedPreconditionError("Push of " + what +
                                   ": no layer's forward is open: " + why);
  }
  return OkStatus();
}

StatusOr<SavedTensor> Offloader::PushOne(const Tensor& tensor, int layer) {
  Impl& impl = *impl_;
  SavedTensor saved;
  saved.owner_ = reinterpret_cast<uintptr_t>(this);
  saved.iteration_ = impl.iteration;
  saved.pushed_layer_ = layer;
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    saved.kept_ = tensor;
    ++stats_.tensors_kept;
    return saved;
  }
  Group& group = *impl.groups[layer];
  std::shared_ptr<Event> ready = tensor.ready;
  const bool from_push = ready == nullptr;
  if (from_push) {
    OFFLOAD_ASSIGN_OR_RETURN(ready, group.NextPushEvent(impl.ctx));
    OFFLOAD_RETURN_IF_ERROR(impl.ctx.compute->Record(*ready));
  }
  saved.layer_ = layer;
  saved.index_ = group.Add(tensor, std::move(ready), from_push);
  ++stats_.tensors_offloaded;
  return saved;
}

StatusOr<SavedTensor> Offloader::Push(const Tensor& tensor) {
  Impl& impl = *impl_;
  SavedTensor saved;
  saved.owner_ = reinterpret_cast<uintptr_t>(this);
  saved.iteration_ = impl.iteration;
  if (!options_.enabled) {
    saved.kept_ = tensor;
    return saved;
  }
  OFFLOAD_RETURN_IF_ERROR(CheckPush("tensor " + tensor.Describe()));
  const int layer = impl.open_layer;
  if (!WillOffload(layer)) {  // SPEC §4.4: no processing at all
    saved.pushed_layer_ = layer;
    saved.kept_ = tensor;
    return saved;
  }
  OFFLOAD_RETURN_IF_ERROR(
      ValidateTensor(tensor).WithContext("Push in " + LayerName(layer)));
  return PushOne(tensor, layer);
}

StatusOr<SavedTensor> Offloader::Push(const CompositeTensor& tensor) {
  Impl& impl = *impl_;
  SavedTensor saved;
  saved.owner_ = reinterpret_cast<uintptr_t>(this);
  saved.iteration_ = impl.iteration;
  saved.composite_ = true;
  saved.metadata_ = tensor.metadata;
  saved.name_ = tensor.name;
  const bool enabled = options_.enabled;
  if (enabled) {
    OFFLOAD_RETURN_IF_ERROR(CheckPush("composite '" + tensor.name + "'"));
  }
  const int layer = enabled ? impl.open_layer : -1;
  const bool offloaded = enabled && WillOffload(layer);
  // Check every component before touching anything: a failed push adds
  // nothing to the group.
  if (offloaded) {
    for (size_t i = 0; i < tensor.components.size(); ++i) {
      if (!tensor.components[i].has_value()) continue;
      OFFLOAD_RETURN_IF_ERROR(ValidateTensor(*tensor.components[i])
                                  .WithContext("Push in " + LayerName(layer) +
                                               " of composite '" + tensor.name +
                                               "' component " +
                                               std::to_string(i)));
    }
  }
  saved.pushed_layer_ = layer;
  for (const std::optional<Tensor>& component : tensor.components) {
    if (!component.has_value()) {
      saved.components_.emplace_back();
      continue;
    }
    if (!offloaded) {
      SavedTensor kept;
      kept.owner_ = saved.owner_;
      kept.iteration_ = saved.iteration_;
      kept.pushed_layer_ = layer;
      kept.kept_ = *component;
      saved.components_.emplace_back(std::move(kept));
      continue;
    }
    OFFLOAD_ASSIGN_OR_RETURN(SavedTensor part, PushOne(*component, layer));
    saved.components_.emplace_back(std::move(part));
  }
  return saved;
}

Status Offloader::CheckHandle(const SavedTensor& saved,
                              const char* call) const {
  if (saved.owner_ == 0) {
    return InvalidArgumentError(std::string(call) +
                                ": an empty SavedTensor (not from Push)");
  }
  if (saved.owner_ != reinterpret_cast<uintptr_t>(this)) {
    return InvalidArgumentError(std::string(call) +
                                ": the SavedTensor belongs to another "
                                "Offloader");
  }
  if (options_.enabled && saved.iteration_ != impl_->iteration) {
    return InvalidArgumentError(
        std::string(call) + ": the SavedTensor was pushed in iteration " +
        std::to_string(saved.iteration_) + ", this is " + impl_->Iteration());
  }
  return OkStatus();
}

StatusOr<Tensor> Offloader::PopOne(const SavedTensor& saved) {
  if (saved.kept_.has_value()) return *saved.kept_;
  StatusOr<Tensor> tensor =
      impl_->groups[saved.layer_]->Pop(saved.index_, impl_->ctx);
  return tensor;
}

StatusOr<Tensor> Offloader::Pop(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "Pop"));
  if (saved.composite_) {
    return InvalidArgumentError("Pop of composite '" + saved.name_ +
                                "': use PopComposite");
  }
  return PopOne(saved);
}

StatusOr<CompositeTensor> Offloader::PopComposite(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "PopComposite"));
  if (!saved.composite_) {
    return InvalidArgumentError("PopComposite of a plain tensor: use Pop");
  }
  CompositeTensor tensor;
  tensor.name = saved.name_;
  tensor.metadata = saved.metadata_;
  for (const std::optional<SavedTensor>& component : saved.components_) {
    if (!component.has_value()) {
      tensor.components.emplace_back();
      continue;
    }
    OFFLOAD_ASSIGN_OR_RETURN(Tensor part, PopOne(*component));
    tensor.components.emplace_back(std::move(part));
  }
  return tensor;
}

Status Offloader::CheckManual(const char* call, int layer) const {
  std::string where = std::string(call) + "(" + LayerName(layer) + ")";
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
  if (layer >= impl_->forward_count) {
    return FailedPreconditionError(where + ": its forward has not begun in " +
                                   impl_->Iteration());
  }
  return OkStatus();
}

Status Offloader::StartOffload(int layer) {
  if (!options_.enabled) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(CheckManual("StartOffload", layer));
  OFFLOAD_RETURN_IF_ERROR(impl_->groups[layer]->StartOffload(impl_->ctx));
  if (impl_->open_layer == layer) impl_->open_layer = -1;  // closed
  return OkStatus();
}

Status Offloader::ReleaseForwardMemory(int layer) {
  if (!options_.enabled) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(CheckManual("ReleaseForwardMemory", layer));
  return impl_->groups[layer]->ReleaseForwardMemory(impl_->ctx);
}

Status Offloader::StartReload(int layer) {
  if (!options_.enabled) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(CheckManual("StartReload", layer));
  return impl_->groups[layer]->StartReload(impl_->ctx);
}

}  // namespace offload
