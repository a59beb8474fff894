// The real GPU for the Python package: CudaBackend (backends/cuda) on
// PyTorch's current stream, with device memory from PyTorch's CUDA caching
// allocator (so torch.cuda.max_memory_allocated counts the engine's
// reloads) and Stream::Gather done by PyTorch's strided copy kernel.
// Compiled only when the package is built with CUDA (ACTOFFLOAD_WITH_CUDA).

#ifndef ACTOFFLOAD_CSRC_TORCH_CUDA_H_
#define ACTOFFLOAD_CSRC_TORCH_CUDA_H_

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>

#include "engine/backend.h"
#include "engine/status.h"

namespace actoffload {

// A backend on CUDA device `device` whose compute stream is PyTorch's
// current stream of that device now; `*compute_handle` is set to its
// cudaStream_t (as an integer, 0 for the default stream).
// Errors: what NewCudaBackend returns (kUnavailable without a device).
offload::StatusOr<std::unique_ptr<offload::Backend>> NewTorchCudaBackend(
    int device, int64_t pinned_slab_bytes, int64_t* compute_handle);

// PyTorch's record_stream for `storage` on `stream` (a stream of a backend
// from NewTorchCudaBackend): the caching allocator does not reuse the
// storage's memory, once freed, before the work enqueued on `stream` so far
// completes. Errors: kInvalidArgument for a foreign stream.
offload::Status TorchRecordStream(offload::Backend& backend,
                                  const c10::Storage& storage,
                                  offload::Stream& stream);

// A stream of `backend` (from NewTorchCudaBackend) over the CUDA stream
// `handle` (a torch.cuda.Stream's cuda_stream): TE's offload_stream.
// Errors: kInvalidArgument for a null handle.
offload::StatusOr<offload::Stream*> TorchWrapStream(offload::Backend& backend,
                                                    int64_t handle);

// Blocks until the device is idle (cudaDeviceSynchronize).
offload::Status TorchCudaSynchronize(offload::Backend& backend);

}  // namespace actoffload

#endif  // ACTOFFLOAD_CSRC_TORCH_CUDA_H_
