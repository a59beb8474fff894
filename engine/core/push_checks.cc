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

Status CheckHandle(const SavedTensor& saved, uint64_t owner,
                   uint64_t iteration, bool check_iteration,
                   const std::string& call, const std::string& front_door) {
  if (saved.owner() == 0) {
    return InvalidArgumentError(call + ": an empty SavedTensor (not from Push)");
  }
  if (saved.owner() != owner) {
    return InvalidArgumentError(call + ": the SavedTensor belongs to another " +
                                front_door);
  }
  if (check_iteration && saved.iteration() != iteration) {
    return InvalidArgumentError(
        call + ": the SavedTensor was pushed in iteration " +
        std::to_string(saved.iteration()) + ", this is iteration " +
        std::to_string(iteration));
  }
  return OkStatus();
}

StatusOr<Tensor> PopPlain(const SavedTensor& saved, const PopOneFn& pop_one) {
  if (const SavedTensor::Composite* composite = saved.composite()) {
    return InvalidArgumentError("Pop of composite '" + composite->name +
                                "': use PopComposite");
  }
  return pop_one(saved);
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
    OFFLOAD_ASSIGN_OR_RETURN(Tensor part, pop_one(*component));
    tensor.components.emplace_back(std::move(part));
  }
  return tensor;
}

}  // namespace offload
