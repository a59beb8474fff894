// CudaBackend (cuda_backend.h): creation, streams, events and copies. Device
// and pinned memory are in cuda_memory.cc, graph capture in cuda_graph.cc;
// what they share (the Stream and Event classes) in cuda_internal.h.

#include "backends/cuda/cuda_backend.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "backends/cuda/cuda_internal.h"

namespace offload {
namespace {

using cuda_internal::Hex;
using cuda_internal::kPinnedAlignment;
using cuda_internal::Quote;

}  // namespace

Status CudaErrorStatus(cudaError_t error, std::string_view call,
                       std::string_view context) {
  // Clear the runtime's last-error state so that the failure does not
  // resurface in an unrelated later call (sticky errors stay regardless).
  (void)cudaGetLastError();
  std::string message;
  if (!context.empty()) {
    message.append(context);
    message.append(": ");
  }
  message.append(call);
  message.append(" failed: ");
  message.append(cudaGetErrorName(error));
  message.append(": ");
  message.append(cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return ResourceExhaustedError(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
      return UnavailableError(std::move(message));
    case cudaErrorInvalidDevice:
      return InvalidArgumentError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

// ---------------------------------------------------------------------------
// Streams and events (the classes are in cuda_internal.h).

Status CudaBackend::CudaEvent::CheckHostWait(
    std::string_view what, std::string_view cuda_call) const {
  const uint64_t capture = capture_.load(std::memory_order_acquire);
  if (capture == 0 &&
      owner_->running_captures_.load(std::memory_order_acquire) == 0) {
    return OkStatus();
  }
  const CudaStream* stream = last_stream_.load(std::memory_order_acquire);
  return owner_->CheckEventSync(
      capture, stream == nullptr ? std::string_view() : stream->name_, what,
      cuda_call);
}

StatusOr<bool> CudaBackend::CudaEvent::Query() {
  if (!recorded_.load(std::memory_order_acquire)) return true;
  OFFLOAD_RETURN_IF_ERROR(CheckHostWait("Event::Query", "cudaEventQuery"));
  const cudaError_t error = cudaEventQuery(event_);
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) return false;
  return CudaErrorStatus(error, "cudaEventQuery", "Event::Query");
}

Status CudaBackend::CudaEvent::Synchronize() {
  if (!recorded_.load(std::memory_order_acquire)) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(
      CheckHostWait("Event::Synchronize", "cudaEventSynchronize"));
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_),
                               "cudaEventSynchronize", "Event::Synchronize");
  return OkStatus();
}

// ---------------------------------------------------------------------------
// Creation and destruction.

CudaBackend::CudaBackend(const CudaOptions& options)
    : options_(options), arena_(kPinnedAlignment) {}

Status CudaBackend::Init() {
  if (options_.pinned_slab_bytes <= 0) {
    return InvalidArgumentError("NewCudaBackend: pinned_slab_bytes must be "
                                "positive, got " +
                                std::to_string(options_.pinned_slab_bytes));
  }
  if (options_.pinned_capacity_bytes < 0) {
    return InvalidArgumentError(
        "NewCudaBackend: pinned_capacity_bytes must be >= 0, got " +
        std::to_string(options_.pinned_capacity_bytes));
  }
  int count = 0;
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count),
                               "cudaGetDeviceCount", "NewCudaBackend");
  if (count == 0) return UnavailableError("NewCudaBackend: no CUDA device");
  const std::string context =
      "NewCudaBackend on device " + std::to_string(options_.device);
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice",
                               context + " (of " + std::to_string(count) + ")");
  cudaDeviceProp props{};
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaGetDeviceProperties(&props, options_.device),
      "cudaGetDeviceProperties", context);
  device_name_ = props.name;
  device_total_bytes_ = props.totalGlobalMem;
  int pools_supported = 0;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported,
                             options_.device),
      "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)", context);
  if (!pools_supported) {
    return UnavailableError(context + " (" + device_name_ +
                            "): the device has no stream-ordered memory pools");
  }
  host_total_bytes_ = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));

  cudaMemPoolProps pool_props{};
  pool_props.allocType = cudaMemAllocationTypePinned;
  pool_props.handleTypes = cudaMemHandleTypeNone;
  pool_props.location.type = cudaMemLocationTypeDevice;
  pool_props.location.id = options_.device;
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&pool_, &pool_props),
                               "cudaMemPoolCreate", context);
  uint64_t threshold = options_.device_pool_release_threshold;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold,
                              &threshold),
      "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", context);
  int internal_dependencies = 0;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool_,
                              cudaMemPoolReuseAllowInternalDependencies,
                              &internal_dependencies),
      "cudaMemPoolSetAttribute(cudaMemPoolReuseAllowInternalDependencies)",
      context);

  if (options_.compute_stream != nullptr) {
    streams_.push_back(std::make_unique<CudaStream>(
        this, options_.compute_stream, "compute", /*owned=*/false));
    compute_ = streams_.back().get();
  } else {
    cudaStream_t stream = nullptr;
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags", context + ", compute stream");
    streams_.push_back(
        std::make_unique<CudaStream>(this, stream, "compute", /*owned=*/true));
    compute_ = streams_.back().get();
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(
    const CudaOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  OFFLOAD_RETURN_IF_ERROR(backend->Init());
  return backend;
}

CudaBackend::~CudaBackend() {
  if (cudaSetDevice(options_.device) != cudaSuccess) (void)cudaGetLastError();
  // A capturing stream cannot be synchronized: end what still runs first.
  EndAllCapturesForDestruction();
  for (auto& stream : streams_) (void)cudaStreamSynchronize(stream->stream_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    (void)ReclaimPinnedLocked(/*wait=*/true);
    for (cudaEvent_t event : spare_events_) (void)cudaEventDestroy(event);
    spare_events_.clear();
    // Safe while recorded work is pending: the driver releases the event
    // once that work completed.
    for (cudaEvent_t event : retired_events_) (void)cudaEventDestroy(event);
    retired_events_.clear();
    for (const auto& [event, capture] : captured_events_) {
      (void)cudaEventDestroy(event);
    }
    captured_events_.clear();
    for (void* slab : slabs_) (void)cudaFreeHost(slab);
    slabs_.clear();
  }
  if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);
  streams_.clear();  // destroys the streams this backend created
}

// ---------------------------------------------------------------------------
// Streams, events, helpers.

Status CudaBackend::UseDevice() const {
  int current = -1;
  OFFLOAD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current), "cudaGetDevice", "");
  if (current != options_.device) {
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaSetDevice(options_.device), "cudaSetDevice",
        "making device " + std::to_string(options_.device) + " current");
  }
  return OkStatus();
}

Stream& CudaBackend::ComputeStream() { return *compute_; }

StatusOr<Stream*> CudaBackend::NewStream(std::string_view name) {
  const std::string context = "NewStream " + Quote(name);
  OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), context);
  cudaStream_t stream = nullptr;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags", context);
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(std::make_unique<CudaStream>(this, stream,
                                                  std::string(name), true));
  return streams_.back().get();
}

StatusOr<Stream*> CudaBackend::WrapStream(cudaStream_t native,
                                          std::string_view name) {
  if (native == nullptr) {
    return InvalidArgumentError("WrapStream " + Quote(name) +
                                ": a null CUDA stream");
  }
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(std::make_unique<CudaStream>(this, native,
                                                  std::string(name), false));
  return streams_.back().get();
}

// During a capture that restricts this thread, only spare events (known
// complete) are reused: cudaEventQuery is capture-unsafe. cudaEventCreate is
// not.
StatusOr<std::unique_ptr<Event>> CudaBackend::NewEvent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool may_query = RestrictingCaptureLocked() == nullptr;
    if (cudaEvent_t event = TakeCompleteEventLocked(may_query);
        event != nullptr) {
      ++counters_.events_reused;
      return std::unique_ptr<Event>(new CudaEvent(this, event));
    }
  }
  OFFLOAD_RETURN_IF_ERROR_WITH(UseDevice(), "NewEvent");
  cudaEvent_t event = nullptr;
  OFFLOAD_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
      "cudaEventCreateWithFlags", "NewEvent");
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.events_created;
  }
  return std::unique_ptr<Event>(new CudaEvent(this, event));
}

const CudaBackend::CudaStream* CudaBackend::Own(const Stream& stream) const {
  const auto* cuda_stream = dynamic_cast<const CudaStream*>(&stream);
  if (cuda_stream == nullptr || cuda_stream->owner_ != this) return nullptr;
  return cuda_stream;
}

bool CudaBackend::OwnsEvent(const Event& event) const {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  return cuda_event != nullptr && cuda_event->owner_ == this;
}

bool CudaBackend::OwnsStream(const Stream& stream) const {
  return Own(stream) != nullptr;
}

StatusOr<cudaStream_t> CudaBackend::NativeStream(const Stream& stream) const {
  const CudaStream* own = Own(stream);
  if (own == nullptr) {
    return InvalidArgumentError("NativeStream: stream " + Quote(stream.name()) +
                                " belongs to another backend");
  }
  return own->stream_;
}

bool CudaBackend::InsideAllocationLocked(uintptr_t address,
                                         int64_t bytes) const {
  auto it = device_live_.upper_bound(address);
  if (it != device_live_.begin()) {
    --it;
    const uintptr_t offset = address - it->first;
    if (offset <= static_cast<uintptr_t>(it->second) &&
        static_cast<uintptr_t>(bytes) <=
            static_cast<uintptr_t>(it->second) - offset) {
      return true;
    }
  }
  return arena_.Contains(address, bytes);
}

Status CudaBackend::CheckCopyRanges(const CudaStream* stream, const void* dst,
                                    const void* src, int64_t bytes) const {
  bool dst_ok, src_ok;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dst_ok = InsideAllocationLocked(reinterpret_cast<uintptr_t>(dst), bytes);
    src_ok = InsideAllocationLocked(reinterpret_cast<uintptr_t>(src), bytes);
    if (dst_ok && src_ok && !captures_.empty()) {
      OFFLOAD_RETURN_IF_ERROR(CheckGraphMemoryLocked(
          stream, stream->name_, reinterpret_cast<uintptr_t>(dst),
          "destination"));
      OFFLOAD_RETURN_IF_ERROR(CheckGraphMemoryLocked(
          stream, stream->name_, reinterpret_cast<uintptr_t>(src), "source"));
    }
  }
  if (dst_ok && src_ok) return OkStatus();
  const void* pointer = dst_ok ? src : dst;
  return InvalidArgumentError(
      std::string("the ") + (dst_ok ? "source" : "destination") + " range [" +
      Hex(pointer) + ", +" + std::to_string(bytes) +
      ") is not inside one live device or pinned allocation of this backend");
}

}  // namespace offload
