#include "engine/core/push_checks.h"

namespace offload {

bool NeverOffloaded(const Tensor& tensor, int64_t min_elements) {
  return tensor.flags.parameter || tensor.flags.weight ||
         tensor.flags.do_not_offload ||
         tensor.storage->space() != MemorySpace::kDevice ||
         tensor.numel() < min_elements;
}

Status CheckOffloadable(const Tensor& tensor, const Backend& backend,
                        int64_t min_elements, const WhereFn& where) {
  if (Status valid = ValidateTensor(tensor); !valid.ok()) {
    return valid.WithContext(where());
  }
  if (NeverOffloaded(tensor, min_elements)) return OkStatus();
  if (tensor.storage->backend() != &backend) {
    return InvalidArgumentError(where() + ": tensor " + tensor.Describe() +
                                ": its storage belongs to another backend");
  }
  if (tensor.ready != nullptr && !backend.Owns(*tensor.ready)) {
    return InvalidArgumentError(where() + ": tensor " + tensor.Describe() +
                                ": its ready event belongs to another "
                                "backend");
  }
  return OkStatus();
}

Status CheckOffloadable(const Tensor& tensor, const Backend& backend,
                        int64_t min_elements, const std::string& where) {
  return CheckOffloadable(tensor, backend, min_elements,
                          WhereFn([&where] { return where; }));
}

StatusOr<SavedTensor> PushComposite(const CompositeTensor& tensor,
                                    const CompositePush& push,
                                    const HandleMaker& handles,
                                    const Backend& backend,
                                    OffloaderStats& stats) {
  if (push.offloaded) {
    for (size_t i = 0; i < tensor.components.size(); ++i) {
      if (!tensor.components[i].has_value()) continue;
      OFFLOAD_RETURN_IF_ERROR(CheckOffloadable(
          *tensor.components[i], backend, push.min_elements, [&] {
            return push.where() + " of composite '" + tensor.name +
                   "' component " + std::to_string(i);
          }));
    }
  }
  if (push.before_push) push.before_push();
  const OffloaderStats stats_before = stats;
  SavedTensor::Composite composite{{}, tensor.metadata, tensor.name};
  for (const std::optional<Tensor>& component : tensor.components) {
    if (!component.has_value()) {
      composite.components.emplace_back();
    } else if (!push.offloaded) {
      composite.components.emplace_back(handles.Kept(*component, push.slot));
    } else {
      StatusOr<SavedTensor> part = push.push_one(*component);
      if (!part.ok()) {
        push.undo();
        stats = stats_before;
        return part.status().WithContext("Push of composite '" + tensor.name +
                                         "' (no component was pushed)");
      }
      composite.components.emplace_back(std::move(part).value());
    }
  }
  return handles.Composite(push.slot, std::move(composite));
}

namespace {

// A popped tensor must have memory: one whose storage was released (a
// forced release while another handle still read it, or the caller's own
// doing) is an error, never handed back to read garbage.
StatusOr<Tensor> WithMemory(StatusOr<Tensor> popped, const std::string& what) {
  if (popped.ok() && popped->storage != nullptr && popped->nbytes() > 0 &&
      popped->storage->data() == nullptr) {
    return FailedPreconditionError(
        what + " " + popped->Describe() +
        ": its memory was released before its backward; nothing handed back");
  }
  return popped;
}

}  // namespace

StatusOr<Tensor> PopPlain(const SavedTensor& saved, const PopOneFn& pop_one) {
  if (const SavedTensor::Composite* composite = saved.composite()) {
    return InvalidArgumentError("Pop of composite '" + composite->name +
                                "': use PopComposite");
  }
  return WithMemory(pop_one(saved), "Pop of tensor");
}

StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved,
                                       const PopOneFn& pop_one) {
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
    OFFLOAD_ASSIGN_OR_RETURN(
        Tensor part,
        WithMemory(pop_one(*component),
                   "PopComposite of '" + composite->name + "' component " +
                       std::to_string(tensor.components.size())));
    tensor.components.emplace_back(std::move(part));
  }
  return tensor;
}

}  // namespace offload
