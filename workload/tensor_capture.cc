#include "workload/tensor_capture.h"

#include <memory>
#include <span>
#include <utility>

#include "workload/tensor_util.h"

namespace offload {

StatusOr<BytesFuture> CaptureByCopy(Backend& backend, const Tensor& tensor) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  if (tensor.numel() == 0) {
    return BytesFuture([]() -> StatusOr<std::vector<uint8_t>> {
      return std::vector<uint8_t>();
    });
  }
  auto [begin, end] = tensor.ByteExtent();
  OFFLOAD_ASSIGN_OR_RETURN(Buffer pinned, backend.AllocatePinned(end - begin));
  const auto* source = static_cast<const uint8_t*>(tensor.storage->data());
  OFFLOAD_RETURN_IF_ERROR(backend.ComputeStream().Copy(
      pinned.data(), source + begin, end - begin));
  auto held = std::make_shared<Buffer>(std::move(pinned));
  Tensor geometry = tensor;
  geometry.storage = nullptr;
  geometry.ready = nullptr;
  return BytesFuture([held, geometry, begin = begin,
                      end = end]() -> StatusOr<std::vector<uint8_t>> {
    return GatherViewBytes(
        std::span<const uint8_t>(static_cast<const uint8_t*>(held->data()),
                                 static_cast<size_t>(end - begin)),
        begin, geometry);
  });
}

}  // namespace offload
