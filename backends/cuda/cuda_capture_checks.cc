// Graph capture for CudaBackend, the bookkeeping and the checks: which
// streams capture, which device memory is graph memory, which events were
// recorded in a capture, and the checks the rest of the backend runs before
// its CUDA calls so that a call CUDA would refuse, or that would invalidate a
// capture, fails with a message instead (cuda_backend.h says which). The
// Backend's capture calls, and the CUDA facts this relies on, are in
// cuda_graph.cc.

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_internal.h"

namespace offload {
namespace {

using cuda_internal::Hex;
using cuda_internal::Quote;

}  // namespace

// ---------------------------------------------------------------------------
// Bookkeeping and checks.

uint64_t CudaBackend::CaptureOf(const CudaStream* stream) const {
  if (running_captures_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return CaptureOfLocked(stream);
}

uint64_t CudaBackend::CaptureOfLocked(const CudaStream* stream) const {
  auto it = capturing_.find(stream);
  return it == capturing_.end() ? 0 : it->second;
}

// CUDA's rule for a thread in the default (global) interaction mode: it is
// prohibited from unsafe calls while it runs a non-relaxed capture itself or
// another thread runs a global one. (A thread that switched itself to
// relaxed with cudaThreadExchangeStreamCaptureMode would be allowed more;
// this backend does not look.)
const CudaBackend::Capture* CudaBackend::RestrictingCaptureLocked() const {
  const std::thread::id me = std::this_thread::get_id();
  for (const auto& [id, capture] : captures_) {
    if (capture.mode == CaptureMode::kGlobal ||
        (capture.mode == CaptureMode::kThreadLocal && capture.thread == me)) {
      return &capture;
    }
  }
  return nullptr;
}

std::string CudaBackend::DescribeCaptureLocked(uint64_t id) const {
  auto it = captures_.find(id);
  if (it == captures_.end()) return "a capture that has ended";
  return "the capture of stream " + Quote(it->second.origin_name) + " (" +
         std::string(CaptureModeName(it->second.mode)) + " mode)";
}

Status CudaBackend::CheckUnrestricted(std::string_view what,
                                      std::string_view why) const {
  if (running_captures_.load(std::memory_order_acquire) == 0) {
    return OkStatus();
  }
  std::lock_guard<std::mutex> lock(mu_);
  const Capture* capture = RestrictingCaptureLocked();
  if (capture == nullptr) return OkStatus();
  return FailedPreconditionError(
      std::string(what) + ": not allowed while stream " +
      Quote(capture->origin_name) + " is capturing (" +
      std::string(CaptureModeName(capture->mode)) +
      " mode): " + std::string(why));
}

Status CudaBackend::CheckStreamSync(const CudaStream* stream,
                                    std::string_view stream_name) const {
  const std::string what = "Synchronize stream " + Quote(stream_name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const uint64_t capture = CaptureOfLocked(stream); capture != 0) {
      return FailedPreconditionError(
          what + ": the stream is part of " + DescribeCaptureLocked(capture) +
          ": its work is recorded, not run, so there is nothing to wait for "
          "(CUDA refuses it and invalidates the capture)");
    }
  }
  return CheckUnrestricted(
      what,
      "cudaStreamSynchronize is capture-unsafe and would invalidate "
      "the capture");
}

Status CudaBackend::CheckEventSync(uint64_t capture,
                                   std::string_view stream_name,
                                   std::string_view what,
                                   std::string_view cuda_call) const {
  std::string subject = std::string(what) + " of the event last recorded";
  if (!stream_name.empty()) subject += " on stream " + Quote(stream_name);
  if (capture != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (CaptureRunningLocked(capture)) {
      return FailedPreconditionError(
          subject + ": that record is part of " +
          DescribeCaptureLocked(capture) +
          ", which still runs: captured work is not scheduled, so it cannot "
          "be waited for or polled (CUDA: cudaErrorCapturedEvent)");
    }
    return FailedPreconditionError(
        subject +
        ": that record was captured by a capture that has ended, "
        "so the work it stands for never ran (record the event "
        "again outside a capture first)");
  }
  return CheckUnrestricted(subject, std::string(cuda_call) +
                                        " is capture-unsafe and would "
                                        "invalidate the capture");
}

Status CudaBackend::CheckWait(const CudaStream* stream,
                              std::string_view stream_name,
                              uint64_t event_capture) const {
  const std::string what = "Wait on stream " + Quote(stream_name);
  std::lock_guard<std::mutex> lock(mu_);
  if (event_capture != 0 && !CaptureRunningLocked(event_capture)) {
    return FailedPreconditionError(
        what +
        ": the event was last recorded in a capture that has ended, "
        "so the work it stands for never ran (record it again outside "
        "a capture first)");
  }
  const uint64_t mine = CaptureOfLocked(stream);
  if (mine == 0) return OkStatus();  // joins event_capture, if any
  if (event_capture == 0) {
    return FailedPreconditionError(
        what + ", which is part of " + DescribeCaptureLocked(mine) +
        ": the event was recorded outside the capture; only in-stream order "
        "crosses into a capture (CUDA: cudaErrorStreamCaptureIsolation, "
        "which would invalidate the capture)");
  }
  if (event_capture != mine) {
    return FailedPreconditionError(
        what + ", which is part of " + DescribeCaptureLocked(mine) +
        ": the event was recorded in " + DescribeCaptureLocked(event_capture) +
        "; two captures cannot be merged");
  }
  return OkStatus();
}

void CudaBackend::JoinCapture(const CudaStream* stream, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mu_);
  if (CaptureOfLocked(stream) == 0 && CaptureRunningLocked(capture)) {
    capturing_[stream] = capture;
  }
}

Status CudaBackend::CheckGraphMemoryLocked(const CudaStream* stream,
                                           std::string_view stream_name,
                                           uintptr_t address,
                                           std::string_view side) const {
  const uint64_t mine = CaptureOfLocked(stream);
  for (const auto& [id, capture] : captures_) {
    if (id == mine) continue;
    auto it = capture.allocations.upper_bound(address);
    if (it == capture.allocations.begin()) continue;
    --it;
    if (address - it->first < static_cast<uintptr_t>(it->second)) {
      return FailedPreconditionError(
          "the " + std::string(side) + " at " +
          Hex(reinterpret_cast<const void*>(address)) + " is graph memory of " +
          DescribeCaptureLocked(id) +
          ": it exists only for the work of that capture, and stream " +
          Quote(stream_name) + " is not part of it");
    }
  }
  return OkStatus();
}

Status CudaBackend::CheckDeviceFree(const CudaStream* stream,
                                    std::string_view stream_name,
                                    uintptr_t address, bool* skip,
                                    uint64_t* capture) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto orphan = orphans_.find(address); orphan != orphans_.end()) {
    orphans_.erase(orphan);
    orphan_count_.store(static_cast<int64_t>(orphans_.size()),
                        std::memory_order_release);
    *skip = true;
    return OkStatus();
  }
  const uint64_t mine = CaptureOfLocked(stream);
  for (const auto& [id, running] : captures_) {
    if (running.allocations.count(address) == 0) continue;
    if (id != mine) {
      return FailedPreconditionError(
          "the memory is graph memory of " + DescribeCaptureLocked(id) +
          ", freed only on a stream of that capture (a free node), and "
          "stream " +
          Quote(stream_name) +
          (mine == 0 ? " is not capturing" : " is part of another capture"));
    }
    *capture = id;
    return OkStatus();
  }
  if (mine != 0) {
    return FailedPreconditionError(
        "the stream is part of " + DescribeCaptureLocked(mine) +
        " and the memory was allocated outside the capture: CUDA captures "
        "frees of graph memory only (free it on a stream that is not "
        "capturing, ordered after the graph's work)");
  }
  return OkStatus();
}

void CudaBackend::NoteGraphAllocationLocked(uint64_t capture, uintptr_t address,
                                            int64_t bytes) {
  auto it = captures_.find(capture);
  if (it == captures_.end()) return;
  it->second.allocations[address] = bytes;
  ++it->second.allocation_nodes;
}

void CudaBackend::ForgetGraphAllocationLocked(uint64_t capture,
                                              uintptr_t address) {
  auto it = captures_.find(capture);
  if (it != captures_.end()) it->second.allocations.erase(address);
}

void CudaBackend::DestroyGraphObjects(
    cudaGraph_t graph, cudaGraphExec_t exec,
    std::shared_ptr<std::atomic<bool>> exec_slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (RestrictingCaptureLocked() != nullptr) {
      if (exec != nullptr) {
        deferred_execs_.push_back(DeferredExec{exec, std::move(exec_slot)});
      }
      if (graph != nullptr) deferred_graphs_.push_back(graph);
      return;
    }
  }
  if (exec != nullptr) {
    if (cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
    if (exec_slot != nullptr) exec_slot->store(false);
  }
  if (graph != nullptr && cudaGraphDestroy(graph) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void CudaBackend::FlushDeferredLocked(bool force) {
  if (!force && RestrictingCaptureLocked() != nullptr) return;
  for (DeferredExec& deferred : deferred_execs_) {
    if (cudaGraphExecDestroy(deferred.exec) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    if (deferred.slot != nullptr) deferred.slot->store(false);
  }
  deferred_execs_.clear();
  for (cudaGraph_t graph : deferred_graphs_) {
    if (cudaGraphDestroy(graph) != cudaSuccess) (void)cudaGetLastError();
  }
  deferred_graphs_.clear();
}

void CudaBackend::EndAllCapturesForDestruction() {
  std::vector<cudaStream_t> origins;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, capture] : captures_) {
      origins.push_back(capture.native);
    }
  }
  for (cudaStream_t origin : origins) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(origin, &graph) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  std::lock_guard<std::mutex> lock(mu_);
  captures_.clear();
  capturing_.clear();
  running_captures_.store(0, std::memory_order_release);
  orphans_.clear();
  orphan_count_.store(0, std::memory_order_release);
  FlushDeferredLocked(/*force=*/true);
}

}  // namespace offload
