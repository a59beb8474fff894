// Graph capture for CudaBackend: CUDA stream capture behind the optional
// capability of engine/backend.h. cuda_backend.h says what is captured, what
// is refused and why; this file has the Graph and GraphExec it returns and
// BeginCapture, EndCapture, Instantiate and Launch; cuda_capture_checks.cc
// has the capture bookkeeping (which streams capture, which device memory is
// graph memory, which events were recorded in a capture) and the checks the
// rest of the backend runs before its CUDA calls.
//
// CUDA facts this relies on (CUDA runtime API reference, 13.0):
//  - cudaStreamBeginCapture(stream, mode); in mode Global or ThreadLocal
//    cudaStreamEndCapture must come from the same thread. "Potentially
//    unsafe" calls (cudaMalloc, and calls that wait for or poll the device:
//    cudaEventQuery, cudaEventSynchronize, cudaStreamSynchronize, ...) are
//    prohibited from every thread while a Global capture runs and from the
//    capturing thread while a ThreadLocal one runs; a prohibited call
//    invalidates the capture (cudaThreadExchangeStreamCaptureMode). Even in
//    Relaxed mode a query of an event last recorded in a capture fails
//    (cudaErrorCapturedEvent), as does synchronizing a capturing stream
//    (cudaErrorStreamCaptureUnsupported).
//  - A stream that waits on an event recorded in a capture joins it; a
//    capturing stream must not wait on an event from outside its capture
//    (cudaErrorStreamCaptureIsolation, which invalidates the capture); every
//    joined stream must be joined back into the origin before
//    cudaStreamEndCapture (cudaErrorStreamCaptureUnjoined otherwise), which
//    takes all of them out of capture mode, also on failure.
//  - cudaMallocAsync / cudaMallocFromPoolAsync on a capturing stream create
//    an allocation node ("the allocation is owned by the graph instead of
//    the memory pool; the memory pool's properties are used to set the
//    node's creation parameters"); cudaFreeAsync on a capturing stream
//    creates a free node "and must therefore be passed the address of a
//    graph allocation". An allocation freed in its graph cannot be freed
//    outside it; a graph with memory nodes can have one executable graph at
//    a time; cudaGraphLaunch fails if allocations of the previous launch are
//    unfreed (unless cudaGraphInstantiateFlagAutoFreeOnLaunch).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_internal.h"

namespace offload {
namespace {

using cuda_internal::Quote;

cudaStreamCaptureMode ToCuda(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal:
      return cudaStreamCaptureModeGlobal;
    case CaptureMode::kThreadLocal:
      return cudaStreamCaptureModeThreadLocal;
    case CaptureMode::kRelaxed:
      return cudaStreamCaptureModeRelaxed;
  }
  return cudaStreamCaptureModeGlobal;
}

}  // namespace

// What EndCapture recorded: owns the cudaGraph_t.
class CudaBackend::CudaGraph final : public Graph {
 public:
  CudaGraph(CudaBackend* owner, cudaGraph_t graph, int64_t nodes,
            std::string origin, int64_t unfreed_allocations,
            int64_t unfreed_bytes, bool memory_nodes)
      : owner_(owner),
        graph_(graph),
        nodes_(nodes),
        origin_(std::move(origin)),
        unfreed_allocations_(unfreed_allocations),
        unfreed_bytes_(unfreed_bytes),
        memory_nodes_(memory_nodes) {}
  ~CudaGraph() override {
    owner_->DestroyGraphObjects(graph_, nullptr, nullptr);
  }

  int64_t size() const override { return nodes_; }

  // "the graph captured on stream 'compute' (7 nodes)".
  std::string Describe() const {
    return "the graph captured on stream " + Quote(origin_) + " (" +
           std::to_string(nodes_) + " nodes)";
  }

  CudaBackend* const owner_;
  const cudaGraph_t graph_;
  const int64_t nodes_;
  const std::string origin_;
  // Graph memory allocated in the capture and not freed in it.
  const int64_t unfreed_allocations_;
  const int64_t unfreed_bytes_;
  // Whether the graph has allocation (and so free) nodes: then CUDA allows
  // one exec of it at a time, and `exec_slot_` says whether one exists.
  const bool memory_nodes_;
  const std::shared_ptr<std::atomic<bool>> exec_slot_ =
      std::make_shared<std::atomic<bool>>(false);
};

// An instantiated graph: owns the cudaGraphExec_t.
class CudaBackend::CudaGraphExec final : public GraphExec {
 public:
  CudaGraphExec(CudaBackend* owner, cudaGraphExec_t exec,
                std::shared_ptr<std::atomic<bool>> slot, std::string graph)
      : owner_(owner),
        exec_(exec),
        slot_(std::move(slot)),
        graph_(std::move(graph)) {}
  // CUDA lets a launch still running complete.
  ~CudaGraphExec() override {
    owner_->DestroyGraphObjects(nullptr, exec_, std::move(slot_));
  }

  CudaBackend* const owner_;
  const cudaGraphExec_t exec_;
  std::shared_ptr<std::atomic<bool>> slot_;  // the graph's, or null
  const std::string graph_;                  // CudaGraph::Describe()
};

// ---------------------------------------------------------------------------
// The Backend calls.

bool CudaBackend::IsCapturing(const Stream& stream) const {
  const CudaStream* own = Own(stream);
  return own != nullptr && CaptureOf(own) != 0;
}

Status CudaBackend::BeginCapture(Stream& stream, CaptureMode mode) {
  const std::string context = "BeginCapture on stream " + Quote(stream.name()) +
                              " (" + std::string(CaptureModeName(mode)) +
                              " mode)";
  const CudaStream* own = Own(stream);
  if (own == nullptr) {
    return InvalidArgumentError(context +
                                ": the stream belongs to another backend");
  }
  OFFLOAD_ASSIGN_OR_RETURN(cudaStream_t native, NativeStream(stream));
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const uint64_t current = CaptureOfLocked(own); current != 0) {
      const bool origin = captures_.at(current).origin == own;
      return FailedPreconditionError(context +
                                     ": the stream is capturing already (" +
                                     (origin ? "origin of " : "joined to ") +
                                     DescribeCaptureLocked(current) + ")");
    }
    // Registered before CUDA starts capturing, so that no call of this
    // backend on another thread slips an unsafe CUDA call into the capture;
    // undone if the start fails.
    id = next_capture_id_++;
    Capture& capture = captures_[id];
    capture.id = id;
    capture.origin = own;
    capture.native = native;
    capture.origin_name = std::string(stream.name());
    capture.mode = mode;
    capture.thread = std::this_thread::get_id();
    capturing_[own] = id;
    running_captures_.fetch_add(1, std::memory_order_acq_rel);
  }
  Status status = UseDevice();
  if (status.ok()) {
    const cudaError_t error = cudaStreamBeginCapture(native, ToCuda(mode));
    if (error != cudaSuccess) {
      status = CudaErrorStatus(error, "cudaStreamBeginCapture", context);
    }
  } else {
    status = status.WithContext(context);
  }
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_.erase(own);
    captures_.erase(id);
    running_captures_.fetch_sub(1, std::memory_order_acq_rel);
  }
  return status;
}

StatusOr<std::unique_ptr<Graph>> CudaBackend::EndCapture(Stream& stream) {
  const std::string context = "EndCapture on stream " + Quote(stream.name());
  const CudaStream* own = Own(stream);
  if (own == nullptr) {
    return InvalidArgumentError(context +
                                ": the stream belongs to another backend");
  }
  uint64_t id = 0;
  cudaStream_t native = nullptr;
  std::string described;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = CaptureOfLocked(own);
    if (id == 0) {
      return FailedPreconditionError(context + ": the stream is not capturing");
    }
    const Capture& capture = captures_.at(id);
    described = DescribeCaptureLocked(id);
    if (capture.origin != own) {
      return FailedPreconditionError(
          context + ": the stream joined " + described +
          "; a capture is ended on its origin stream");
    }
    if (capture.mode != CaptureMode::kRelaxed &&
        capture.thread != std::this_thread::get_id()) {
      return FailedPreconditionError(
          context + ": " + described +
          " began on another thread, and CUDA ends a capture that is not "
          "relaxed only on the thread that began it (the capture goes on)");
    }
    native = capture.native;
  }

  cudaGraph_t graph = nullptr;
  const cudaError_t error = cudaStreamEndCapture(native, &graph);
  if (error != cudaSuccess) {
    // CUDA takes the capture's streams out of capture mode on failure too;
    // should the origin still be capturing, the capture goes on here too.
    cudaStreamCaptureStatus still = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(native, &still) != cudaSuccess) {
      (void)cudaGetLastError();
      still = cudaStreamCaptureStatusNone;
    }
    if (still != cudaStreamCaptureStatusNone) {
      if (graph != nullptr) DestroyGraphObjects(graph, nullptr, nullptr);
      const Status status =
          CudaErrorStatus(error, "cudaStreamEndCapture", context);
      return Status(status.code(), status.message() + " (the capture goes on)");
    }
  }

  int64_t unfreed = 0;
  int64_t unfreed_bytes = 0;
  int64_t allocation_nodes = 0;
  std::string origin_name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = captures_.find(id);
    if (it != captures_.end()) {
      Capture capture = std::move(it->second);
      captures_.erase(it);
      running_captures_.fetch_sub(1, std::memory_order_acq_rel);
      for (auto s = capturing_.begin(); s != capturing_.end();) {
        s = s->second == id ? capturing_.erase(s) : std::next(s);
      }
      // Graph memory never freed in the capture: never mapped (the graph
      // is not instantiated), so its Buffers are dropped without CUDA.
      for (const auto& [address, bytes] : capture.allocations) {
        device_live_.erase(address);
        counters_.device_bytes_in_use -= bytes;
        orphans_[address] = bytes;
        ++unfreed;
        unfreed_bytes += bytes;
      }
      orphan_count_.store(static_cast<int64_t>(orphans_.size()),
                          std::memory_order_release);
      allocation_nodes = capture.allocation_nodes;
      origin_name = std::move(capture.origin_name);
    }
    FlushDeferredLocked(/*force=*/false);
  }

  if (error != cudaSuccess) {
    if (graph != nullptr) DestroyGraphObjects(graph, nullptr, nullptr);
    const Status status =
        CudaErrorStatus(error, "cudaStreamEndCapture", context);
    const std::string ended =
        "; the capture has ended and nothing it recorded will run";
    switch (error) {
      case cudaErrorStreamCaptureUnjoined:
        return FailedPreconditionError(
            status.message() + " (unjoined: a stream joined to " + described +
            " has captured work the origin does not wait for; join every "
            "stream back with Record and Wait before EndCapture" +
            ended + ")");
      case cudaErrorStreamCaptureInvalidated:
        return FailedPreconditionError(
            status.message() +
            " (a call CUDA refuses during a capture, "
            "made outside this backend, invalidated " +
            described + ended + ")");
      default:
        return Status(status.code(),
                      status.message() + " (the capture has ended)");
    }
  }
  if (graph == nullptr) {
    return InternalError(context + ": cudaStreamEndCapture returned no graph");
  }
  size_t nodes = 0;
  const cudaError_t count_error = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (count_error != cudaSuccess) {
    DestroyGraphObjects(graph, nullptr, nullptr);
    return CudaErrorStatus(count_error, "cudaGraphGetNodes", context);
  }
  return std::unique_ptr<Graph>(new CudaGraph(
      this, graph, static_cast<int64_t>(nodes), std::move(origin_name), unfreed,
      unfreed_bytes, allocation_nodes > 0));
}

StatusOr<std::unique_ptr<GraphExec>> CudaBackend::Instantiate(
    const Graph& graph) {
  const auto* cuda_graph = dynamic_cast<const CudaGraph*>(&graph);
  if (cuda_graph == nullptr || cuda_graph->owner_ != this) {
    return InvalidArgumentError(
        "Instantiate: the graph comes from another backend");
  }
  const std::string context = "Instantiate of " + cuda_graph->Describe();
  if (cuda_graph->unfreed_allocations_ > 0) {
    return FailedPreconditionError(
        context + ": " + std::to_string(cuda_graph->unfreed_allocations_) +
        " device allocation(s) of " +
        std::to_string(cuda_graph->unfreed_bytes_) +
        " bytes made in the capture are not freed in it; every allocation "
        "of a graph must be freed in the capture, so that each launch frees "
        "what it allocates");
  }
  OFFLOAD_RETURN_IF_ERROR(
      CheckUnrestricted(context, "cudaGraphInstantiate is not capture-safe"));
  std::shared_ptr<std::atomic<bool>> slot;
  if (cuda_graph->memory_nodes_) {
    if (cuda_graph->exec_slot_->exchange(true)) {
      return FailedPreconditionError(
          context +
          ": the graph has memory nodes and an exec of it still "
          "exists; CUDA allows one at a time (destroy that "
          "GraphExec first)");
    }
    slot = cuda_graph->exec_slot_;
  }
  auto release_slot = [&] {
    if (slot != nullptr) slot->store(false);
  };
  if (Status status = UseDevice(); !status.ok()) {
    release_slot();
    return status.WithContext(context);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t error =
      cudaGraphInstantiateWithFlags(&exec, cuda_graph->graph_, 0);
  if (error != cudaSuccess) {
    release_slot();
    return CudaErrorStatus(error, "cudaGraphInstantiateWithFlags", context);
  }
  return std::unique_ptr<GraphExec>(
      new CudaGraphExec(this, exec, std::move(slot), cuda_graph->Describe()));
}

Status CudaBackend::Launch(GraphExec& exec, Stream& stream) {
  auto* cuda_exec = dynamic_cast<CudaGraphExec*>(&exec);
  if (cuda_exec == nullptr || cuda_exec->owner_ != this) {
    return InvalidArgumentError("Launch on stream " + Quote(stream.name()) +
                                ": the exec comes from another backend");
  }
  const std::string context =
      "Launch of " + cuda_exec->graph_ + " on stream " + Quote(stream.name());
  const CudaStream* own = Own(stream);
  if (own == nullptr) {
    return InvalidArgumentError(context +
                                ": the stream belongs to another backend");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const uint64_t capture = CaptureOfLocked(own); capture != 0) {
      return FailedPreconditionError(
          context + ": the stream is part of " +
          DescribeCaptureLocked(capture) +
          "; a graph is launched on a stream that is not capturing");
    }
  }
  OFFLOAD_RETURN_IF_ERROR(
      CheckUnrestricted(context,
                        "cudaGraphLaunch may map graph memory and is not "
                        "capture-safe"));
  OFFLOAD_ASSIGN_OR_RETURN(cudaStream_t native, NativeStream(stream));
  OFFLOAD_RETURN_IF_ERROR(UseDevice().WithContext(context));
  const cudaError_t error = cudaGraphLaunch(cuda_exec->exec_, native);
  if (error != cudaSuccess) {
    return CudaErrorStatus(error, "cudaGraphLaunch", context);
  }
  return OkStatus();
}

}  // namespace offload
