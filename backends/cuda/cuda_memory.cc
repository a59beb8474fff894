// CudaBackend (cuda_backend.h): device and pinned memory, their
// stream-ordered release, statistics and trimming. Streams, events and
// copies are in cuda_backend.cc, graph capture in cuda_graph.cc.

#include <algorithm>
#include <string>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_internal.h"

namespace offload {
namespace {

using cuda_internal::Hex;
using cuda_internal::kPinnedAlignment;
using cuda_internal::Quote;
using cuda_internal::RoundUp;

// Why AllocatePinned and pinned frees are refused during a capture.
constexpr std::string_view kNoPinnedInCapture =
    "the pinned pool's cudaHostAlloc, cudaFreeHost and cudaEventQuery are "
    "capture-unsafe, and a piece freed now could be handed out again while "
    "the graph uses it (allocate pinned buffers before the capture and keep "
    "them)";
constexpr int64_t kDedicatedSlabGranularity = int64_t{2} << 20;

}  // namespace

// ---------------------------------------------------------------------------
// Device memory.

StatusOr<Buffer> CudaBackend::AllocateDevice(int64_t bytes, Stream& stream) {
  auto context = [&] {
    return "AllocateDevice of " + std::to_string(bytes) +
           " bytes on stream " + Quote(stream.name());
  };
  if (bytes <= 0) {
    return InvalidArgumentError(context() + ": the size must be positive");
  }
  const CudaStream* own = Own(stream);
  if (own == nullptr) {
    return InvalidArgumentError(context() +
                                ": the stream belongs to another backend");
  }
  if (static_cast<uint64_t>(bytes) > device_total_bytes_) {
    return ResourceExhaustedError(
        context() + ": more than the device's " +
        std::to_string(device_total_bytes_) + " bytes (" + device_name_ + ")");
  }
  OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), context());
  // On a capturing stream this makes an allocation node: graph memory
  // (cuda_backend.h).
  const uint64_t capture = CaptureOf(own);
  void* data = nullptr;
  if (options_.device_allocator != nullptr) {
    if (capture != 0) {
      return FailedPreconditionError(
          context() + ": the stream is capturing, and graph memory needs the "
          "backend's own pool (this backend allocates from a "
          "CudaDeviceAllocator)");
    }
    StatusOr<void*> got =
        options_.device_allocator->Allocate(bytes, own->stream_);
    if (!got.ok()) return got.status().WithContext(context());
    data = *got;
    std::lock_guard<std::mutex> lock(mu_);
    device_live_[reinterpret_cast<uintptr_t>(data)] = bytes;
    ++counters_.device_allocations;
    counters_.device_bytes_in_use += bytes;
    device_bytes_peak_ =
        std::max(device_bytes_peak_, counters_.device_bytes_in_use);
    return MakeBuffer(data, bytes, MemorySpace::kDevice, &stream);
  }
  const cudaError_t error = cudaMallocFromPoolAsync(
      &data, static_cast<size_t>(bytes), pool_, own->stream_);
  if (error != cudaSuccess) {
    Status status =
        CudaErrorStatus(error, "cudaMallocFromPoolAsync", context());
    if (error == cudaErrorMemoryAllocation) {
      uint64_t reserved = 0, used = 0;
      if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent,
                                  &reserved) == cudaSuccess &&
          cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent,
                                  &used) == cudaSuccess) {
        status = ResourceExhaustedError(
            status.message() + " (this backend's pool: " +
            std::to_string(reserved) + " bytes reserved, " +
            std::to_string(used) + " in use)");
      } else {
        (void)cudaGetLastError();
      }
    }
    return status;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_live_[reinterpret_cast<uintptr_t>(data)] = bytes;
    ++counters_.device_allocations;
    counters_.device_bytes_in_use += bytes;
    device_bytes_peak_ =
        std::max(device_bytes_peak_, counters_.device_bytes_in_use);
    if (capture != 0) {
      NoteGraphAllocationLocked(capture, reinterpret_cast<uintptr_t>(data),
                                bytes);
    }
  }
  return MakeBuffer(data, bytes, MemorySpace::kDevice, &stream);
}

// ---------------------------------------------------------------------------
// Pinned memory.

StatusOr<Buffer> CudaBackend::AllocatePinned(int64_t bytes) {
  auto context = [&] {
    return "AllocatePinned of " + std::to_string(bytes) + " bytes";
  };
  if (bytes <= 0) {
    return InvalidArgumentError(context() + ": the size must be positive");
  }
  if (options_.pinned_capacity_bytes > 0 &&
      bytes > options_.pinned_capacity_bytes) {
    return ResourceExhaustedError(
        context() + ": more than the pinned capacity of " +
        std::to_string(options_.pinned_capacity_bytes) + " bytes");
  }
  if (bytes > host_total_bytes_) {
    return ResourceExhaustedError(
        context() + ": more than the host's physical memory of " +
        std::to_string(host_total_bytes_) + " bytes");
  }
  OFFLOAD_RETURN_IF_ERROR(CheckUnrestricted(context(), kNoPinnedInCapture));
  uintptr_t address = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    StatusOr<uintptr_t> allocated = AllocatePinnedLocked(bytes);
    if (!allocated.ok()) return allocated.status().WithContext(context());
    address = *allocated;
    ++counters_.pinned_allocations;
  }
  return MakeBuffer(reinterpret_cast<void*>(address), bytes,
                    MemorySpace::kPinnedHost, nullptr);
}

StatusOr<uintptr_t> CudaBackend::AllocatePinnedLocked(int64_t bytes) {
  OFFLOAD_RETURN_IF_ERROR(ReclaimPinnedLocked(/*wait=*/false));
  if (std::optional<uintptr_t> address = arena_.Allocate(bytes)) {
    return *address;
  }
  const int64_t needed = RoundUp(bytes, kPinnedAlignment);
  // Tries to add a slab that can hold `bytes`; the status of the failure.
  auto grow = [&]() -> Status {
    int64_t slab = std::max(RoundUp(options_.pinned_slab_bytes,
                                    kPinnedAlignment),
                            RoundUp(bytes, kDedicatedSlabGranularity));
    if (options_.pinned_capacity_bytes > 0) {
      const int64_t room =
          (options_.pinned_capacity_bytes - arena_.slab_bytes()) /
          kPinnedAlignment * kPinnedAlignment;
      slab = std::min(slab, room);
      if (slab < needed) {
        return ResourceExhaustedError(
            "the pinned capacity of " +
            std::to_string(options_.pinned_capacity_bytes) + " bytes is " +
            "used up (" + std::to_string(arena_.slab_bytes()) +
            " bytes in slabs, " + std::to_string(arena_.used_bytes()) +
            " handed out or pending, largest free piece " +
            std::to_string(arena_.largest_free_chunk()) + " bytes)");
      }
    }
    void* base = nullptr;
    const cudaError_t error = cudaHostAlloc(
        &base, static_cast<size_t>(slab), cudaHostAllocPortable);
    if (error != cudaSuccess) {
      return CudaErrorStatus(error, "cudaHostAlloc",
                             "a pinned slab of " + std::to_string(slab) +
                                 " bytes");
    }
    slabs_.push_back(base);
    arena_.AddSlab(reinterpret_cast<uintptr_t>(base), slab);
    ++counters_.pinned_slab_allocations;
    return OkStatus();
  };

  Status grown = grow();
  if (grown.ok()) {
    if (std::optional<uintptr_t> address = arena_.Allocate(bytes)) {
      return *address;
    }
    return InternalError("a new pinned slab could not serve the request");
  }
  if (grown.code() != StatusCode::kResourceExhausted) return grown;
  // Out of pinned memory: wait for the pending frees, give back empty
  // slabs, and try once more.
  ++counters_.pinned_blocking_waits;
  OFFLOAD_RETURN_IF_ERROR(ReclaimPinnedLocked(/*wait=*/true));
  if (std::optional<uintptr_t> address = arena_.Allocate(bytes)) {
    return *address;
  }
  OFFLOAD_RETURN_IF_ERROR(ReleaseFreeSlabsLocked());
  Status again = grow();
  if (again.ok()) {
    if (std::optional<uintptr_t> address = arena_.Allocate(bytes)) {
      return *address;
    }
    return InternalError("a new pinned slab could not serve the request");
  }
  return again;
}

Status CudaBackend::ReclaimPinnedLocked(bool wait) {
  for (auto& [stream, queue] : pending_) {
    while (!queue.empty()) {
      PendingFree& front = queue.front();
      if (wait) {
        OFFLOAD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(front.event),
                                     "cudaEventSynchronize",
                                     "waiting for a pinned free");
      } else {
        const cudaError_t error = cudaEventQuery(front.event);
        if (error == cudaErrorNotReady) break;
        if (error != cudaSuccess) {
          return CudaErrorStatus(error, "cudaEventQuery",
                                 "polling a pinned free");
        }
      }
      if (!arena_.Free(front.address)) {
        return InternalError("a pending pinned free of an unknown address");
      }
      spare_events_.push_back(front.event);
      --counters_.pinned_pending_frees;
      queue.pop_front();
    }
  }
  return OkStatus();
}

StatusOr<cudaEvent_t> CudaBackend::TakeEventLocked() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  if (!retired_events_.empty()) {
    // Recorded again at once: what it captured before does not matter.
    cudaEvent_t event = retired_events_.front();
    retired_events_.pop_front();
    return event;
  }
  // Last recorded in a capture that has ended: a new record outside any
  // capture makes it an ordinary event again.
  for (auto it = captured_events_.begin(); it != captured_events_.end();
       ++it) {
    if (!CaptureRunningLocked(it->second)) {
      cudaEvent_t event = it->first;
      captured_events_.erase(it);
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
      "cudaEventCreateWithFlags", "an event for a pinned free");
  ++counters_.events_created;
  return event;
}

cudaEvent_t CudaBackend::TakeCompleteEventLocked(bool may_query) {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  if (!may_query || retired_events_.empty()) return nullptr;
  // Oldest first: the one most likely complete. One query at most.
  const cudaError_t error = cudaEventQuery(retired_events_.front());
  if (error != cudaSuccess) {
    if (error != cudaErrorNotReady) (void)cudaGetLastError();
    return nullptr;  // pending (or failed: left for the destructor)
  }
  cudaEvent_t event = retired_events_.front();
  retired_events_.pop_front();
  return event;
}

void CudaBackend::RetireEvent(cudaEvent_t event, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mu_);
  // cudaEventQuery of an event last recorded in a capture fails
  // (cudaErrorCapturedEvent): such events are kept apart.
  if (capture != 0) {
    captured_events_.emplace_back(event, capture);
  } else {
    retired_events_.push_back(event);
  }
}

Status CudaBackend::ReleaseFreeSlabsLocked() {
  for (const auto& [base, size] : arena_.RemoveEmptySlabs()) {
    void* pointer = reinterpret_cast<void*>(base);
    slabs_.erase(std::find(slabs_.begin(), slabs_.end(), pointer));
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaFreeHost(pointer), "cudaFreeHost",
        "releasing a pinned slab of " + std::to_string(size) + " bytes");
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// Release, statistics, trimming.

Status CudaBackend::Release(void* data, int64_t size, MemorySpace space,
                            Stream* stream) {
  const CudaStream* own =
      stream == nullptr ? nullptr : Own(*stream);
  if (stream != nullptr && own == nullptr) {
    return InvalidArgumentError("Release: stream " + Quote(stream->name()) +
                                " belongs to another backend");
  }
  if (space == MemorySpace::kDevice) {
    if (own == nullptr) own = compute_;
    auto context = [&] {
      return "freeing " + std::to_string(size) +
             " bytes of device memory on stream " + Quote(own->name_);
    };
    const auto address = reinterpret_cast<uintptr_t>(data);
    // On a capturing stream cudaFreeAsync makes a free node, legal only for
    // graph memory of that capture.
    uint64_t capture = 0;
    if (running_captures_.load(std::memory_order_acquire) != 0 ||
        orphan_count_.load(std::memory_order_acquire) != 0) {
      bool skip = false;
      OFFLOAD_RETURN_IF_ERROR_WITH(
          CheckDeviceFree(own, own->name_, address, &skip, &capture),
          context());
      if (skip) return OkStatus();
    }
    OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), context());
    if (options_.device_allocator != nullptr) {
      OFFLOAD_RETURN_IF_ERROR_WITH(
          options_.device_allocator->Free(data, own->stream_), context());
    } else {
      OFFLOAD_CUDA_RETURN_IF_ERROR(cudaFreeAsync(data, own->stream_),
                                   "cudaFreeAsync", context());
    }
    std::lock_guard<std::mutex> lock(mu_);
    device_live_.erase(address);
    counters_.device_bytes_in_use -= size;
    if (capture != 0) ForgetGraphAllocationLocked(capture, address);
    return OkStatus();
  }

  const auto address = reinterpret_cast<uintptr_t>(data);
  auto pinned_context = [&] {
    return "freeing " + std::to_string(size) + " bytes of pinned memory" +
           (own == nullptr ? std::string(" at once")
                           : " on stream " + Quote(own->name_));
  };
  if (own != nullptr && CaptureOf(own) != 0) {
    return FailedPreconditionError(
        pinned_context() +
        ": the stream is capturing, and the pinned pool would record the "
        "event that returns the piece into the capture (free it on a stream "
        "that is not capturing, ordered after the graph's work)");
  }
  OFFLOAD_RETURN_IF_ERROR(
      CheckUnrestricted(pinned_context(), kNoPinnedInCapture));
  std::lock_guard<std::mutex> lock(mu_);
  if (own == nullptr) {
    if (!arena_.Free(address)) {
      return InternalError("freeing " + std::to_string(size) +
                           " bytes of pinned memory at " + Hex(data) +
                           ": not handed out by this backend");
    }
    return OkStatus();
  }
  OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), pinned_context());
  StatusOr<cudaEvent_t> event = TakeEventLocked();
  if (!event.ok()) return event.status().WithContext(pinned_context());
  const cudaError_t error = cudaEventRecord(*event, own->stream_);
  if (error != cudaSuccess) {
    retired_events_.push_back(*event);  // maybe pending: not spare
    return CudaErrorStatus(error, "cudaEventRecord", pinned_context());
  }
  pending_[own->stream_].push_back(PendingFree{*event, address});
  ++counters_.pinned_pending_frees;
  return OkStatus();
}

void CudaBackend::OnReleaseFailed(const Status& /*status*/) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.release_failures;
}

StatusOr<CudaBackendStats> CudaBackend::stats() const {
  CudaBackendStats stats;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats = counters_;
    stats.pinned_slab_bytes = arena_.slab_bytes();
    stats.pinned_bytes_in_use = arena_.used_bytes();
  }
  struct {
    cudaMemPoolAttr attr;
    uint64_t* value;
    const char* name;
  } reads[] = {
      {cudaMemPoolAttrReservedMemCurrent, &stats.device_pool_reserved_bytes,
       "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemCurrent)"},
      {cudaMemPoolAttrReservedMemHigh, &stats.device_pool_reserved_high,
       "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemHigh)"},
      {cudaMemPoolAttrUsedMemCurrent, &stats.device_pool_used_bytes,
       "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent)"},
  };
  for (const auto& read : reads) {
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaMemPoolGetAttribute(pool_, read.attr, read.value), read.name,
        "CudaBackend::stats");
  }
  return stats;
}

Status CudaBackend::Trim() {
  if (running_captures_.load(std::memory_order_acquire) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!captures_.empty()) {
      return FailedPreconditionError(
          "Trim: not allowed while " +
          DescribeCaptureLocked(captures_.begin()->first) +
          " runs: it synchronizes every stream of this backend");
    }
  }
  OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), "Trim");
  std::vector<CudaStream*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& stream : streams_) streams.push_back(stream.get());
  }
  for (CudaStream* stream : streams) {
    OFFLOAD_RETURN_IF_ERROR(stream->Synchronize());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    OFFLOAD_RETURN_IF_ERROR(ReclaimPinnedLocked(/*wait=*/true));
    OFFLOAD_RETURN_IF_ERROR(ReleaseFreeSlabsLocked());
  }
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool_, 0),
                               "cudaMemPoolTrimTo", "Trim");
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaDeviceGraphMemTrim(options_.device),
                               "cudaDeviceGraphMemTrim", "Trim");
  return OkStatus();
}

}  // namespace offload
