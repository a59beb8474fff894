// CudaBackend: the Backend interface (engine/backend.h) on a real NVIDIA GPU,
// through the CUDA runtime API.
//
//  - Streams are created with cudaStreamCreateWithFlags(cudaStreamNonBlocking):
//    they never synchronize with the legacy default stream. ComputeStream() is
//    such a stream named "compute" (or, with CudaOptions::compute_stream, a
//    stream the caller owns, e.g. PyTorch's current stream).
//  - Events are created with cudaEventDisableTiming (the cheapest kind) and
//    pooled: a destroyed Event's CUDA event is handed out again by NewEvent
//    once it has completed (a completed event behaves as one never
//    recorded), which saves a cudaEventCreate and a cudaEventDestroy.
//  - Copy is cudaMemcpyAsync(cudaMemcpyDefault): the driver picks the copy
//    engine of the direction, so a D2H stream and an H2D stream run at once.
//  - Stream::Gather keeps the interface's default implementation: one Copy
//    per contiguous run of the view (no kernels in this backend yet).
//  - Device memory comes from a stream-ordered pool of this backend
//    (cudaMemPoolCreate, cudaMallocFromPoolAsync / cudaFreeAsync). Its release
//    threshold defaults to UINT64_MAX, so memory freed in one iteration stays
//    reserved for the next and the steady state reserves nothing new. The pool
//    does not insert hidden cross-stream dependencies
//    (cudaMemPoolReuseAllowInternalDependencies is off): memory freed on
//    another stream is reused once that free has run, or when an event
//    orders the allocating stream after it, as backend.h describes.
//  - Pinned memory comes from slabs of cudaHostAlloc'd memory (PinnedArena
//    does the bookkeeping), reused across iterations. Free(buffer, stream)
//    records an event on `stream`; the piece goes back to the pool once a
//    later allocation finds that event complete (cudaEventQuery, never a
//    wait, unless the pool is out of capacity). Dropping a pinned Buffer
//    returns its piece at once. New slabs are allocated only when no free
//    piece fits, so a repeated workload allocates none after its first
//    iteration.
//  - Every CUDA failure becomes a Status naming the call and carrying
//    cudaGetErrorName / cudaGetErrorString; out-of-memory is
//    kResourceExhausted with the bytes asked for.
//
// Thread-safe: one mutex guards the pools and bookkeeping (the CUDA calls
// that enqueue work run outside it). All Buffers and Events must be
// destroyed before the backend.

#ifndef OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_
#define OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/pinned_arena.h"
#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

struct CudaOptions {
  // The CUDA device ordinal.
  int device = 0;
  // Pinned memory is taken from the driver in slabs of this many bytes; a
  // larger request gets a slab of its own size (rounded up to 2 MiB), whose
  // remainder serves later requests.
  int64_t pinned_slab_bytes = int64_t{64} << 20;
  // At most this many bytes of pinned slabs (0: no limit but the host's).
  int64_t pinned_capacity_bytes = 0;
  // cudaMemPoolAttrReleaseThreshold of the device pool: reserved memory above
  // this is given back to the driver at synchronization points. UINT64_MAX
  // keeps everything between iterations.
  uint64_t device_pool_release_threshold =
      std::numeric_limits<uint64_t>::max();
  // Whether Stream::Copy checks that both ranges lie inside one live
  // allocation of this backend (kInvalidArgument otherwise). Turn off when
  // copies involve memory of another allocator (a framework's tensors).
  bool check_copy_ranges = true;
  // If set, ComputeStream() wraps this stream (not owned, not destroyed; it
  // must outlive the backend) instead of creating one.
  cudaStream_t compute_stream = nullptr;
};

// Counters for tests and benchmarks. Device pool figures come from
// cudaMemPoolGetAttribute.
struct CudaBackendStats {
  int64_t pinned_slab_allocations = 0;  // successful cudaHostAlloc calls
  int64_t pinned_slab_bytes = 0;        // bytes of slabs held now
  int64_t pinned_allocations = 0;       // successful AllocatePinned calls
  int64_t pinned_bytes_in_use = 0;      // handed out, or freed but pending
  int64_t pinned_pending_frees = 0;     // frees waiting for their event
  int64_t pinned_blocking_waits = 0;    // allocations that had to wait for
                                        // pending frees (out of capacity)
  int64_t device_allocations = 0;       // successful AllocateDevice calls
  int64_t device_bytes_in_use = 0;      // allocated and not freed (host order)
  uint64_t device_pool_reserved_bytes = 0;  // ReservedMemCurrent
  uint64_t device_pool_reserved_high = 0;   // ReservedMemHigh
  uint64_t device_pool_used_bytes = 0;      // UsedMemCurrent
  int64_t events_created = 0;  // cudaEventCreate calls (NewEvent + pool)
  int64_t events_reused = 0;   // NewEvent calls served by a pooled event
  int64_t release_failures = 0;  // ~Buffer releases that failed
};

// The Status for a failed CUDA call: "<context>: <call> failed:
// <cudaGetErrorName>: <cudaGetErrorString>". Codes: cudaErrorMemoryAllocation
// -> kResourceExhausted; cudaErrorNoDevice, cudaErrorInsufficientDriver,
// cudaErrorNotSupported -> kUnavailable; cudaErrorInvalidDevice ->
// kInvalidArgument; everything else kInternal. Also clears the runtime's
// last-error state of non-sticky errors. REQUIRES: error != cudaSuccess.
Status CudaErrorStatus(cudaError_t error, std::string_view call,
                       std::string_view context);

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Backend.
  Stream& ComputeStream() override;
  StatusOr<Stream*> NewStream(std::string_view name) override;
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

  // The CUDA stream behind a stream of this backend; kInvalidArgument for a
  // foreign stream. (For work the interface has no call for, e.g. cuBLAS.)
  StatusOr<cudaStream_t> NativeStream(const Stream& stream) const;

  // Counters; kInternal if the pool attributes cannot be read.
  StatusOr<CudaBackendStats> stats() const;

  // Gives reserved but unused device pool memory back to the driver
  // (cudaMemPoolTrimTo after synchronizing this backend's streams), and
  // releases pinned slabs with nothing handed out or pending.
  Status Trim();

  int device() const { return options_.device; }
  const CudaOptions& options() const { return options_; }
  // cudaDeviceProp::name of the device.
  const std::string& device_name() const { return device_name_; }

 protected:
  Status Release(void* data, int64_t size, MemorySpace space,
                 Stream* stream) override;
  bool OwnsStream(const Stream& stream) const override;
  bool OwnsEvent(const Event& event) const override;

 private:
  class CudaStream;
  class CudaEvent;
  friend class CudaStream;
  friend class CudaEvent;
  friend StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(
      const CudaOptions& options);

  // A stream-ordered pinned free waiting for its event.
  struct PendingFree {
    cudaEvent_t event = nullptr;
    uintptr_t address = 0;
  };

  explicit CudaBackend(const CudaOptions& options);
  Status Init();

  // Makes options_.device current on the calling thread.
  Status UseDevice() const;
  // The CudaStream behind `stream` if it belongs to this backend.
  const CudaStream* Own(const Stream& stream) const;
  // Whether both ranges lie inside one live allocation each (Copy's check).
  Status CheckCopyRanges(const void* dst, const void* src,
                         int64_t bytes) const;
  bool InsideAllocationLocked(uintptr_t address, int64_t bytes) const;

  // With mu_ held: returns pinned pieces whose free event completed; with
  // `wait`, first waits for every pending event.
  Status ReclaimPinnedLocked(bool wait);
  StatusOr<cudaEvent_t> TakeEventLocked();
  // A complete pooled event for NewEvent (spare, or retired and found
  // complete by cudaEventQuery), or nullptr if there is none.
  cudaEvent_t TakeCompleteEventLocked();
  // ~CudaEvent's path: keeps `event` for reuse.
  void RetireEvent(cudaEvent_t event);
  StatusOr<uintptr_t> AllocatePinnedLocked(int64_t bytes);
  Status ReleaseFreeSlabsLocked();

  void OnReleaseFailed(const Status& status) override;

  const CudaOptions options_;
  std::string device_name_;
  uint64_t device_total_bytes_ = 0;
  int64_t host_total_bytes_ = 0;
  cudaMemPool_t pool_ = nullptr;
  std::vector<std::unique_ptr<CudaStream>> streams_;  // guarded by mu_
  CudaStream* compute_ = nullptr;                     // set by Init

  mutable std::mutex mu_;
  PinnedArena arena_;
  std::vector<void*> slabs_;  // cudaHostAlloc'd bases
  // Per CUDA stream, in record order (completion is in order on a stream).
  std::map<cudaStream_t, std::deque<PendingFree>> pending_;
  std::vector<cudaEvent_t> spare_events_;  // complete
  // Destroyed Events' CUDA events, oldest first; may still be pending.
  std::deque<cudaEvent_t> retired_events_;
  std::map<uintptr_t, int64_t> device_live_;  // address -> bytes
  CudaBackendStats counters_;
};

// Creates a backend on `options.device`. Errors: kUnavailable if there is no
// usable CUDA device or driver, or the device has no memory pools;
// kInvalidArgument for a bad ordinal or option; kInternal otherwise.
StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(
    const CudaOptions& options);

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_
