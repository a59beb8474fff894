// What the CudaBackend's source files (cuda_backend.cc, cuda_memory.cc,
// cuda_graph.cc, cuda_capture_checks.cc) share: small helpers, the CUDA
// status macros, and the backend's Stream and Event classes. Private to
// //backends/cuda:cuda_backend.

#ifndef OFFLOAD_BACKENDS_CUDA_CUDA_INTERNAL_H_
#define OFFLOAD_BACKENDS_CUDA_CUDA_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "backends/cuda/cuda_backend.h"

namespace offload::cuda_internal {

// Pinned pieces (and so every pinned buffer) start at multiples of this.
inline constexpr int64_t kPinnedAlignment = 256;

inline int64_t RoundUp(int64_t bytes, int64_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

// "'name'", for stream names in messages.
inline std::string Quote(std::string_view name) {
  return "'" + std::string(name) + "'";
}

// An address in messages.
inline std::string Hex(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", pointer);
  return text;
}

}  // namespace offload::cuda_internal

namespace offload {

// `context` is evaluated only on failure (it may build a string).
#define OFFLOAD_CUDA_RETURN_IF_ERROR(expr, call, context)         \
  do {                                                            \
    cudaError_t offload_cuda_error_ = (expr);                     \
    if (offload_cuda_error_ != cudaSuccess) {                     \
      return CudaErrorStatus(offload_cuda_error_, call, context); \
    }                                                             \
  } while (false)

// Returns `expr` (a Status) with `context` prefixed if it is not OK;
// `context` is evaluated only then.
#define OFFLOAD_RETURN_IF_ERROR_WITH(expr, context) \
  do {                                              \
    ::offload::Status offload_status_ = (expr);     \
    if (!offload_status_.ok()) {                    \
      return offload_status_.WithContext(context);  \
    }                                               \
  } while (false)

class CudaBackend::CudaEvent final : public Event {
 public:
  CudaEvent(CudaBackend* owner, cudaEvent_t event)
      : owner_(owner), event_(event) {}
  // Returns the CUDA event to the backend's pool (NewEvent reuses it once
  // complete; waits already enqueued on it stay in force).
  ~CudaEvent() override {
    owner_->RetireEvent(event_, capture_.load(std::memory_order_acquire));
  }

  // A never-recorded event is complete: no CUDA call (none is allowed on it
  // during a capture, and none is needed).
  StatusOr<bool> Query() override;
  Status Synchronize() override;

  // Stream::Record's bookkeeping after cudaEventRecord succeeded.
  void Recorded(const CudaStream* stream, uint64_t capture) {
    last_stream_.store(stream, std::memory_order_release);
    capture_.store(capture, std::memory_order_release);
    recorded_.store(true, std::memory_order_release);
  }
  // The check of Query and Synchronize before their CUDA call.
  Status CheckHostWait(std::string_view what, std::string_view cuda_call) const;

  CudaBackend* const owner_;
  const cudaEvent_t event_;
  // Set by Record: whether this Event was recorded, the stream of its last
  // record, and the capture that record was captured by (0: none).
  std::atomic<bool> recorded_{false};
  std::atomic<const CudaStream*> last_stream_{nullptr};
  std::atomic<uint64_t> capture_{0};
};

class CudaBackend::CudaStream final : public Stream {
 public:
  CudaStream(CudaBackend* owner, cudaStream_t stream, std::string name,
             bool owned)
      : owner_(owner), stream_(stream), name_(std::move(name)), owned_(owned) {}
  ~CudaStream() override {
    if (owned_) (void)cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return name_; }

  // Gather: the default implementation of Stream (one Copy per contiguous
  // run of the view); a gather kernel would need nvcc.

  Status Copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes < 0) {
      return InvalidArgumentError(Where() + "negative byte count " +
                                  std::to_string(bytes));
    }
    if (dst == nullptr || src == nullptr) {
      return InvalidArgumentError(Where() + "null " +
                                  (dst == nullptr ? "destination" : "source"));
    }
    if (bytes == 0) return OkStatus();
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto s = reinterpret_cast<uintptr_t>(src);
    const auto n = static_cast<uintptr_t>(bytes);
    if ((d >= s ? d - s : s - d) < n) {
      return InvalidArgumentError(
          Where() + "source " + cuda_internal::Hex(src) + " and destination " +
          cuda_internal::Hex(dst) + " overlap in " + std::to_string(bytes) +
          " bytes");
    }
    if (owner_->options_.check_copy_ranges) {
      OFFLOAD_RETURN_IF_ERROR_WITH(
          owner_->CheckCopyRanges(this, dst, src, bytes), Where(bytes));
    }
    OFFLOAD_RETURN_IF_ERROR_WITH(owner_->UseDevice(), Where(bytes));
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault,
                        stream_),
        "cudaMemcpyAsync", Where(bytes));
    return OkStatus();
  }

  // Legal during a capture: on a capturing stream the record is captured
  // (the event then stands for a point in the capture).
  Status Record(Event& event) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->owner_ != owner_) {
      return InvalidArgumentError("Record on stream " +
                                  cuda_internal::Quote(name_) +
                                  ": the event belongs to another backend");
    }
    const uint64_t capture = owner_->CaptureOf(this);
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(cuda_event->event_, stream_), "cudaEventRecord",
        "Record on stream " + cuda_internal::Quote(name_));
    cuda_event->Recorded(this, capture);
    return OkStatus();
  }

  // A stream outside any capture that waits on an event recorded in a
  // running capture joins that capture (as in CUDA).
  Status Wait(const Event& event) override {
    const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->owner_ != owner_) {
      return InvalidArgumentError("Wait on stream " +
                                  cuda_internal::Quote(name_) +
                                  ": the event belongs to another backend");
    }
    // A never-recorded event is complete: nothing to wait for (and in a
    // capture CUDA would refuse the wait, as for any event from outside).
    if (!cuda_event->recorded_.load(std::memory_order_acquire)) {
      return OkStatus();
    }
    const uint64_t event_capture =
        cuda_event->capture_.load(std::memory_order_acquire);
    if (event_capture != 0 ||
        owner_->running_captures_.load(std::memory_order_acquire) != 0) {
      OFFLOAD_RETURN_IF_ERROR(owner_->CheckWait(this, name_, event_capture));
    }
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream_, cuda_event->event_, 0),
        "cudaStreamWaitEvent", "Wait on stream " + cuda_internal::Quote(name_));
    if (event_capture != 0) owner_->JoinCapture(this, event_capture);
    return OkStatus();
  }

  Status Synchronize() override {
    if (owner_->running_captures_.load(std::memory_order_acquire) != 0) {
      OFFLOAD_RETURN_IF_ERROR(owner_->CheckStreamSync(this, name_));
    }
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(stream_), "cudaStreamSynchronize",
        "Synchronize stream " + cuda_internal::Quote(name_));
    return OkStatus();
  }

  std::string Where() const {
    return "Copy on stream " + cuda_internal::Quote(name_) + ": ";
  }
  std::string Where(int64_t bytes) const {
    return "Copy of " + std::to_string(bytes) + " bytes on stream " +
           cuda_internal::Quote(name_);
  }

  CudaBackend* const owner_;
  const cudaStream_t stream_;
  const std::string name_;
  const bool owned_;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_CUDA_CUDA_INTERNAL_H_
