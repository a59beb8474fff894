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
//    recorded), which saves a cudaEventCreate and a cudaEventDestroy. An
//    Event never recorded answers Query, Synchronize and Wait without a CUDA
//    call; one last recorded in a capture is pooled apart (never queried).
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
//  - Graph capture (the optional capability of engine/backend.h; code in
//    cuda_graph.cc) is CUDA stream capture: BeginCapture is
//    cudaStreamBeginCapture with the CaptureMode's cudaStreamCaptureMode,
//    EndCapture cudaStreamEndCapture, Instantiate
//    cudaGraphInstantiateWithFlags, Launch cudaGraphLaunch. Which streams are
//    capturing is this backend's own bookkeeping (BeginCapture, a Wait that
//    joins a stream to a capture, EndCapture); work enqueued on the native
//    streams behind the backend's back is not seen.
//    Device memory allocated on a capturing stream is graph memory: the same
//    cudaMallocFromPoolAsync becomes an allocation node (the graph owns the
//    memory; the pool only lends its properties), and its Free on a stream
//    of that capture a free node. Every allocation of a graph must be freed
//    in it: Instantiate refuses a graph that leaves one unfreed, so each
//    launch allocates and frees its memory, and instantiation needs no
//    cudaGraphInstantiateFlagAutoFreeOnLaunch (it would only matter for
//    allocations that outlive a launch, which no Buffer here could own).
//    Pinned memory is never allocated in a capture: allocate it before and
//    keep it while the graph may run.
//    The backend refuses, before calling CUDA, every call that CUDA would
//    refuse or that would invalidate a capture (kFailedPrecondition naming
//    the call, the stream or event and the capture):
//     - always: Synchronize of a capturing stream; Query or Synchronize of an
//       event last recorded in a capture (running or ended); a Wait on a
//       capturing stream for an event recorded outside the capture or in
//       another one (a never-recorded event is a no-op, no CUDA call); a Wait
//       for an event of an ended capture; a pinned free ordered on a
//       capturing stream; a device free on a capturing stream of memory not
//       allocated in that capture, and of graph memory on a stream outside
//       its capture; a Copy outside a capture that touches its graph memory
//       (when copy ranges are checked); Launch on a capturing stream;
//       BeginCapture of a capturing stream; EndCapture of a joined stream;
//       Trim during any capture.
//     - while a capture restricts the calling thread (a kGlobal capture for
//       every thread, a kThreadLocal one for the thread that began it; never
//       a kRelaxed one), the capture-unsafe calls: Synchronize of any stream,
//       Query or Synchronize of any recorded event (cudaEventQuery /
//       Synchronize), AllocatePinned and every pinned free (the pool's
//       cudaHostAlloc, cudaFreeHost and cudaEventQuery), Instantiate and
//       Launch. NewEvent then reuses only pooled events known complete (no
//       cudaEventQuery). A Graph or GraphExec dropped then is destroyed
//       (cudaGraphDestroy, cudaGraphExecDestroy: not capture-safe) when a
//       capture ends on a thread no other capture restricts, or with the
//       backend.
//    Not refused, but observed to invalidate a kGlobal capture (H200, CUDA
//    13, 2026-11-23): eager work on a stream outside the capture (a device
//    allocation, copies to and from pinned memory, a free, a record and a
//    stats read on another stream). Do such work outside captures, or
//    capture in kThreadLocal or kRelaxed mode. The engine does none.
//    EndCapture of a kGlobal or kThreadLocal capture must come from the
//    thread that began it (CUDA's rule); from another thread it is refused
//    and the capture goes on.
//
// Thread-safe: one mutex guards the pools and bookkeeping (the CUDA calls
// that enqueue work run outside it). All Buffers, Events, Graphs and
// GraphExecs must be destroyed before the backend; a Buffer of graph memory
// that outlives its capture (never freed in it) must be dropped before its
// Graph is destroyed.

#ifndef OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_
#define OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/pinned_arena.h"
#include "engine/backend.h"
#include "engine/device_bytes_probe.h"
#include "engine/status.h"

namespace offload {

// Where a CudaBackend's device memory comes from when it is not the
// backend's own pool: a framework's allocator (PyTorch's caching allocator,
// python/actoffload), so that the framework's memory statistics count the
// engine's reloads. Not owned by the backend; must outlive it.
class CudaDeviceAllocator {
 public:
  virtual ~CudaDeviceAllocator() = default;
  // Returns `bytes` (> 0) of device memory that work enqueued on `stream`
  // after this call may use. Errors: kResourceExhausted when the allocator
  // has no room; kInternal for other failures.
  virtual StatusOr<void*> Allocate(int64_t bytes, cudaStream_t stream) = 0;
  // Gives back memory from Allocate: it may be reused only by work ordered
  // after everything enqueued on `stream` so far (PyTorch: record_stream on
  // `stream`, then the free). Errors: kInvalidArgument for memory this
  // allocator did not hand out (nothing changes).
  virtual Status Free(void* data, cudaStream_t stream) = 0;
};

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
  // The legacy default stream (PyTorch's default) is cudaStreamLegacy.
  cudaStream_t compute_stream = nullptr;
  // If set, device memory comes from this allocator instead of the
  // backend's stream-ordered pool. AllocateDevice on a capturing stream is
  // then kFailedPrecondition (graph memory needs the pool), and the pool
  // figures of stats() and Trim() concern the unused pool only.
  CudaDeviceAllocator* device_allocator = nullptr;
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
  // A Stream of this backend over `native`, a stream the caller made on
  // this device (a framework's, e.g. TE's offload_stream): not owned, never
  // destroyed here; it must outlive the backend.
  // Errors: kInvalidArgument for a null stream.
  StatusOr<Stream*> WrapStream(cudaStream_t native, std::string_view name);
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

  // Graph capture (cuda_graph.cc; the contract is engine/backend.h's, the
  // CUDA specifics are at the top of this file).
  bool SupportsGraphs() const override { return true; }
  // Whether `stream` is the origin of a capture or joined one; false for a
  // foreign stream.
  bool IsCapturing(const Stream& stream) const override;
  // cudaStreamBeginCapture(stream, mode). Errors: kInvalidArgument for a
  // foreign stream; kFailedPrecondition if it is capturing already; what
  // CUDA returns (e.g. for a caller's compute stream that cannot be
  // captured).
  Status BeginCapture(Stream& stream, CaptureMode mode) override;
  // cudaStreamEndCapture; the capture ends even on failure (then nothing it
  // recorded runs, and its graph memory never exists: Buffers of it are
  // dropped without a CUDA call). Size of the Graph: its CUDA node count
  // (copies, allocations and frees; event records and waits become edges).
  // Errors: kInvalidArgument for a foreign stream; kFailedPrecondition if
  // `stream` is not the origin of a capture, or (capture going on) the
  // capture is kGlobal or kThreadLocal and began on another thread, or
  // (capture ended) a joined stream was not joined back
  // (cudaErrorStreamCaptureUnjoined) or a call outside this backend
  // invalidated the capture (cudaErrorStreamCaptureInvalidated); kInternal
  // for other CUDA failures (capture ended).
  StatusOr<std::unique_ptr<Graph>> EndCapture(Stream& stream) override;
  // cudaGraphInstantiateWithFlags(flags 0). Errors: kInvalidArgument for a
  // graph of another backend; kFailedPrecondition if device memory
  // allocated in the graph is not freed in it, if the graph has memory
  // nodes and an exec of it still exists (CUDA allows one at a time), or
  // while a capture restricts the calling thread; kInternal otherwise.
  StatusOr<std::unique_ptr<GraphExec>> Instantiate(const Graph& graph) override;
  // cudaGraphLaunch. Errors: kInvalidArgument for a foreign exec or stream;
  // kFailedPrecondition if `stream` is capturing or a capture restricts the
  // calling thread; kResourceExhausted if the graph's memory cannot be
  // mapped; kInternal otherwise.
  Status Launch(GraphExec& exec, Stream& stream) override;

  // The CUDA stream behind a stream of this backend; kInvalidArgument for a
  // foreign stream. (For work the interface has no call for, e.g. cuBLAS.)
  StatusOr<cudaStream_t> NativeStream(const Stream& stream) const;

  // Counters; kInternal if the pool attributes cannot be read.
  StatusOr<CudaBackendStats> stats() const;

  // A probe for OffloadOptions::device_bytes_probe (SPEC §4.7): the device
  // bytes allocated through this backend's AllocateDevice (its pool or the
  // CudaDeviceAllocator) and not yet handed to a free, in host order
  // (stats().device_bytes_in_use), with a high-water mark of its own. It
  // counts the engine's tensors and whatever the workload allocates through
  // this backend (layer_stack_bench's activations); memory allocated
  // elsewhere (cudaMalloc, a framework's caching allocator) it does not
  // see: such a caller passes its allocator's count instead. Thread-safe;
  // lives as long as the backend.
  DeviceBytesProbe& InUseProbe() { return in_use_probe_; }

  // Gives reserved but unused device pool memory back to the driver
  // (cudaMemPoolTrimTo after synchronizing this backend's streams) with the
  // device's graph memory no graph is using (cudaDeviceGraphMemTrim), and
  // releases pinned slabs with nothing handed out or pending.
  // Errors: kFailedPrecondition while a capture of this backend runs; what
  // the CUDA calls return.
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
  class CudaGraph;
  class CudaGraphExec;
  friend class CudaStream;
  friend class CudaEvent;
  friend class CudaGraph;
  friend class CudaGraphExec;
  friend StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(
      const CudaOptions& options);

  // A stream-ordered pinned free waiting for its event.
  struct PendingFree {
    cudaEvent_t event = nullptr;
    uintptr_t address = 0;
  };

  // A capture in progress (BeginCapture .. EndCapture).
  struct Capture {
    uint64_t id = 0;
    const CudaStream* origin = nullptr;
    cudaStream_t native = nullptr;  // the origin's CUDA stream
    std::string origin_name;
    CaptureMode mode = CaptureMode::kGlobal;
    std::thread::id thread;  // the thread that began it
    // Graph memory allocated in the capture and not freed in it yet:
    // address -> bytes.
    std::map<uintptr_t, int64_t> allocations;
    int64_t allocation_nodes = 0;  // allocations made in it, freed or not
  };

  explicit CudaBackend(const CudaOptions& options);
  Status Init();

  // Makes options_.device current on the calling thread.
  Status UseDevice() const;
  // The CudaStream behind `stream` if it belongs to this backend.
  const CudaStream* Own(const Stream& stream) const;
  // Whether both ranges lie inside one live allocation each, and graph
  // memory of a running capture is used only by a stream of that capture
  // (Copy's check on `stream`).
  Status CheckCopyRanges(const CudaStream* stream, const void* dst,
                         const void* src, int64_t bytes) const;
  bool InsideAllocationLocked(uintptr_t address, int64_t bytes) const;

  // With mu_ held: returns pinned pieces whose free event completed; with
  // `wait`, first waits for every pending event.
  Status ReclaimPinnedLocked(bool wait);
  StatusOr<cudaEvent_t> TakeEventLocked();
  // A complete pooled event for NewEvent (spare, or, if `may_query`, retired
  // and found complete by cudaEventQuery), or nullptr if there is none.
  cudaEvent_t TakeCompleteEventLocked(bool may_query);
  // ~CudaEvent's path: keeps `event` for reuse. `capture`: the capture its
  // last record was captured by (0: none); such an event is never queried,
  // only recorded again (pinned frees) once that capture ended.
  void RetireEvent(cudaEvent_t event, uint64_t capture);
  StatusOr<uintptr_t> AllocatePinnedLocked(int64_t bytes);
  Status ReleaseFreeSlabsLocked();

  void OnReleaseFailed(const Status& status) override;

  // --- Capture bookkeeping (cuda_capture_checks.cc). ---
  // The capture `stream` is part of (origin or joined), 0 if none. Takes mu_
  // only while a capture runs.
  uint64_t CaptureOf(const CudaStream* stream) const;
  uint64_t CaptureOfLocked(const CudaStream* stream) const;
  // The capture that restricts the calling thread from capture-unsafe calls
  // (see the top of this file), or nullptr.
  const Capture* RestrictingCaptureLocked() const;
  // OK, or kFailedPrecondition "<what>: <why> while stream 'compute' is
  // capturing (global mode)" if a capture restricts the calling thread.
  // Takes mu_ only while a capture runs.
  Status CheckUnrestricted(std::string_view what, std::string_view why) const;
  // "the capture of stream 'compute' (global mode)" for capture `id`.
  std::string DescribeCaptureLocked(uint64_t id) const;
  bool CaptureRunningLocked(uint64_t id) const {
    return captures_.count(id) != 0;
  }
  // Stream::Wait's check for `stream` waiting on an event recorded in
  // capture `event_capture` (0: outside any). REQUIRES: the event was
  // recorded.
  Status CheckWait(const CudaStream* stream, std::string_view stream_name,
                   uint64_t event_capture) const;
  // Stream::Synchronize's check: `stream` is not capturing, and no capture
  // restricts the calling thread.
  Status CheckStreamSync(const CudaStream* stream,
                         std::string_view stream_name) const;
  // Event::Query's and Synchronize's check (`what`, calling `cuda_call`) for
  // an event last recorded on stream `stream_name` in capture `capture` (0:
  // outside any).
  Status CheckEventSync(uint64_t capture, std::string_view stream_name,
                        std::string_view what,
                        std::string_view cuda_call) const;
  // After a successful Wait of a stream outside any capture on an event of
  // running capture `capture`: the stream has joined it (as in CUDA).
  void JoinCapture(const CudaStream* stream, uint64_t capture);
  // Copy's check, with mu_ held: graph memory of a running capture is used
  // only by streams of that capture. `side`: "source" or "destination".
  Status CheckGraphMemoryLocked(const CudaStream* stream,
                                std::string_view stream_name,
                                uintptr_t address,
                                std::string_view side) const;
  // The device free's checks (before cudaFreeAsync). Sets `*skip` when the
  // memory is graph memory of an ended capture (never mapped: nothing to
  // free, the bookkeeping is dropped) and `*capture` to the running capture
  // whose graph memory it is (0: none).
  Status CheckDeviceFree(const CudaStream* stream,
                         std::string_view stream_name, uintptr_t address,
                         bool* skip, uint64_t* capture);
  // After cudaFreeAsync of graph memory of capture `capture` (a free node).
  void ForgetGraphAllocationLocked(uint64_t capture, uintptr_t address);
  // After AllocateDevice on a stream of capture `capture`, with mu_ held.
  void NoteGraphAllocationLocked(uint64_t capture, uintptr_t address,
                                 int64_t bytes);
  // Destroys a graph and an exec now, or, while a capture restricts the
  // calling thread (both calls are capture-unsafe), once it has ended.
  // `exec_slot`, if set, is cleared after the exec is destroyed.
  void DestroyGraphObjects(cudaGraph_t graph, cudaGraphExec_t exec,
                           std::shared_ptr<std::atomic<bool>> exec_slot);
  // Destroys what DestroyGraphObjects deferred, with mu_ held; only when
  // no capture restricts the calling thread, or with `force`.
  void FlushDeferredLocked(bool force);
  // ~CudaBackend's path: ends every capture still running (best effort) and
  // destroys what was deferred.
  void EndAllCapturesForDestruction();

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
  // The most device_bytes_in_use since InUseProbe's last TakePeakBytes.
  int64_t device_bytes_peak_ = 0;  // guarded by mu_

  class InUseProbeImpl final : public DeviceBytesProbe {
   public:
    explicit InUseProbeImpl(CudaBackend& backend) : backend_(backend) {}
    int64_t InUseBytes() override {
      std::lock_guard<std::mutex> lock(backend_.mu_);
      return backend_.counters_.device_bytes_in_use;
    }
    int64_t TakePeakBytes() override {
      std::lock_guard<std::mutex> lock(backend_.mu_);
      const int64_t now = backend_.counters_.device_bytes_in_use;
      const int64_t peak = std::max(backend_.device_bytes_peak_, now);
      backend_.device_bytes_peak_ = now;
      return peak;
    }

   private:
    CudaBackend& backend_;
  };
  InUseProbeImpl in_use_probe_{*this};

  // Capture bookkeeping, guarded by mu_.
  std::map<uint64_t, Capture> captures_;             // running, by id
  std::map<const CudaStream*, uint64_t> capturing_;  // stream -> capture id
  uint64_t next_capture_id_ = 1;
  // Graph memory of ended captures that was never freed in them (its Graph
  // cannot be instantiated: the memory is never mapped): address -> bytes.
  std::map<uintptr_t, int64_t> orphans_;
  // Destroyed Events whose last record was captured: (event, capture).
  std::vector<std::pair<cudaEvent_t, uint64_t>> captured_events_;
  // Graphs and execs destroyed while a capture restricted the thread.
  struct DeferredExec {
    cudaGraphExec_t exec = nullptr;
    std::shared_ptr<std::atomic<bool>> slot;
  };
  std::vector<cudaGraph_t> deferred_graphs_;
  std::vector<DeferredExec> deferred_execs_;
  // Fast paths: captures_.size() and orphans_.size(), readable without mu_.
  std::atomic<int64_t> running_captures_{0};
  std::atomic<int64_t> orphan_count_{0};
};

// Creates a backend on `options.device`. Errors: kUnavailable if there is no
// usable CUDA device or driver, or the device has no memory pools;
// kInvalidArgument for a bad ordinal or option; kInternal otherwise.
StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(
    const CudaOptions& options);

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_CUDA_CUDA_BACKEND_H_
