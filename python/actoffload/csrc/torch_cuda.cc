// See torch_cuda.h.

#include "python/actoffload/csrc/torch_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "engine/backend_wrapper.h"

namespace actoffload {
namespace {

using offload::Status;
using offload::StatusOr;

// PyTorch's stream object for a native handle of device `device`.
c10::cuda::CUDAStream TorchStream(cudaStream_t native, int device) {
  if (native == nullptr || native == cudaStreamLegacy) {
    return c10::cuda::getDefaultCUDAStream(static_cast<c10::DeviceIndex>(device));
  }
  return c10::cuda::getStreamFromExternal(native,
                                          static_cast<c10::DeviceIndex>(device));
}

// Device memory from PyTorch's caching allocator, on the stream asked for.
class TorchDeviceAllocator final : public offload::CudaDeviceAllocator {
 public:
  explicit TorchDeviceAllocator(int device) : device_(device) {}

  StatusOr<void*> Allocate(int64_t bytes, cudaStream_t stream) override {
    c10::cuda::CUDAStreamGuard guard(TorchStream(stream, device_));
    at::DataPtr block;
    try {
      block = c10::cuda::CUDACachingAllocator::get()->allocate(
          static_cast<size_t>(bytes));
    } catch (const c10::Error& error) {
      return offload::ResourceExhaustedError(
          "PyTorch's CUDA caching allocator: " + std::string(error.what_without_backtrace()));
    }
    void* data = block.get();
    std::lock_guard<std::mutex> lock(mu_);
    live_.emplace(data, Block{std::move(block), stream});
    return data;
  }

  Status Free(void* data, cudaStream_t stream) override {
    at::DataPtr block;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(data);
      if (it == live_.end()) {
        return offload::InvalidArgumentError(
            "PyTorch's CUDA caching allocator: freeing memory it did not "
            "hand out to the engine");
      }
      if (it->second.stream != stream) {
        c10::cuda::CUDACachingAllocator::recordStream(
            it->second.data, TorchStream(stream, device_));
      }
      block = std::move(it->second.data);
      live_.erase(it);
    }
    return offload::OkStatus();  // `block` goes back to the allocator here
  }

 private:
  struct Block {
    at::DataPtr data;
    cudaStream_t stream;
  };
  const int device_;
  std::mutex mu_;
  std::map<void*, Block> live_;
};

// What TorchCudaBackend owns, built before its BackendWrapper base (which
// forwards to `cuda`) and destroyed after it: the backend, then the
// allocator it allocates from.
struct TorchCudaParts {
  std::unique_ptr<TorchDeviceAllocator> allocator;
  std::unique_ptr<offload::CudaBackend> cuda;
};

class TorchCudaBackend final : private TorchCudaParts,
                               public offload::BackendWrapper {
 public:
  TorchCudaBackend(TorchCudaParts parts, int device)
      : TorchCudaParts(std::move(parts)),
        offload::BackendWrapper(*cuda),
        device_(device) {}

  StatusOr<cudaStream_t> Native(const offload::Stream& stream) const {
    const offload::Stream* target = TargetStream(stream);
    if (target == nullptr) {
      return offload::InvalidArgumentError("stream '" +
                                           std::string(stream.name()) +
                                           "' belongs to another backend");
    }
    return cuda->NativeStream(*target);
  }
  int device() const { return device_; }
  StatusOr<offload::Stream*> Wrap(cudaStream_t native) {
    OFFLOAD_ASSIGN_OR_RETURN(offload::Stream * target,
                             cuda->WrapStream(native, "offload_stream"));
    return AdoptStream(target);
  }

 protected:
  // A kernel on the stream's SMs: PyTorch's strided copy of the view, as
  // bytes (the last dimension walks the element's bytes).
  Status StreamGather(offload::Stream& stream, void* dst, const void* src,
                      int64_t element_size, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) override {
    OFFLOAD_RETURN_IF_ERROR(offload::ValidateGather(stream.name(), dst, src,
                                                    element_size, shape,
                                                    strides));
    OFFLOAD_ASSIGN_OR_RETURN(cudaStream_t native, Native(stream));
    std::vector<int64_t> sizes(shape), byte_strides;
    for (int64_t stride : strides) byte_strides.push_back(stride * element_size);
    sizes.push_back(element_size);
    byte_strides.push_back(1);
    try {
      c10::cuda::CUDAStreamGuard guard(TorchStream(native, device_));
      auto options = at::TensorOptions().dtype(at::kByte).device(
          c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)));
      at::Tensor from = at::from_blob(const_cast<void*>(src), sizes,
                                      byte_strides, options);
      at::Tensor to = at::from_blob(dst, sizes, options);
      to.copy_(from);
    } catch (const c10::Error& error) {
      return offload::InternalError("Gather on stream '" +
                                    std::string(stream.name()) +
                                    "': " + error.what_without_backtrace());
    }
    return offload::OkStatus();
  }

 private:
  const int device_;
};

}  // namespace

StatusOr<std::unique_ptr<offload::Backend>> NewTorchCudaBackend(
    int device, int64_t pinned_slab_bytes, int64_t* compute_handle) {
  TorchCudaParts parts;
  parts.allocator = std::make_unique<TorchDeviceAllocator>(device);
  cudaStream_t current =
      at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))
          .stream();
  *compute_handle = reinterpret_cast<int64_t>(current);
  offload::CudaOptions options;
  options.device = device;
  options.pinned_slab_bytes = pinned_slab_bytes;
  // PyTorch's tensors are not this backend's allocations.
  options.check_copy_ranges = false;
  options.compute_stream = current == nullptr ? cudaStreamLegacy : current;
  options.device_allocator = parts.allocator.get();
  OFFLOAD_ASSIGN_OR_RETURN(parts.cuda, offload::NewCudaBackend(options));
  return std::unique_ptr<offload::Backend>(
      new TorchCudaBackend(std::move(parts), device));
}

Status TorchRecordStream(offload::Backend& backend, const c10::Storage& storage,
                         offload::Stream& stream) {
  auto& torch_backend = static_cast<TorchCudaBackend&>(backend);
  OFFLOAD_ASSIGN_OR_RETURN(cudaStream_t native, torch_backend.Native(stream));
  c10::cuda::CUDACachingAllocator::recordStream(
      storage.data_ptr(), TorchStream(native, torch_backend.device()));
  return offload::OkStatus();
}

StatusOr<offload::Stream*> TorchWrapStream(offload::Backend& backend,
                                           int64_t handle) {
  return static_cast<TorchCudaBackend&>(backend).Wrap(
      reinterpret_cast<cudaStream_t>(handle));
}

Status TorchCudaSynchronize(offload::Backend& backend) {
  auto& torch_backend = static_cast<TorchCudaBackend&>(backend);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(torch_backend.device()));
  const cudaError_t error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    return offload::CudaErrorStatus(error, "cudaDeviceSynchronize",
                                    "actoffload");
  }
  return offload::OkStatus();
}

}  // namespace actoffload
