// Reading a tensor's bytes back without blocking the host: a capture is
// enqueued on the compute stream and yields the bytes once the host has
// synchronized that stream. The workload driver (workload/workload.h) checks
// popped tensors this way, so that its only host wait is the one at the end
// of an iteration.

#ifndef OFFLOAD_WORKLOAD_TENSOR_CAPTURE_H_
#define OFFLOAD_WORKLOAD_TENSOR_CAPTURE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// Yields captured bytes once the compute stream has been synchronized.
using BytesFuture = std::function<StatusOr<std::vector<uint8_t>>()>;

// Enqueues on the compute stream a read of `tensor`'s logical bytes (as
// ReadTensorBytes returns them) without blocking the host.
using CaptureFn =
    std::function<StatusOr<BytesFuture>(Backend& backend, const Tensor& tensor)>;

// The default CaptureFn: copies the view's byte extent to pinned memory on
// the compute stream (this uses the D2H copy engine and compute-stream time)
// and gathers on the host when the future is called.
StatusOr<BytesFuture> CaptureByCopy(Backend& backend, const Tensor& tensor);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_TENSOR_CAPTURE_H_
