#include "backends/cuda/cuda_backend.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

namespace offload {
namespace {

constexpr int64_t kPinnedAlignment = 256;

// Why AllocatePinned and pinned frees are refused during a capture.
constexpr std::string_view kNoPinnedInCapture =
    "the pinned pool's cudaHostAlloc, cudaFreeHost and cudaEventQuery are "
    "capture-unsafe, and a piece freed now could be handed out again while "
    "the graph uses it (allocate pinned buffers before the capture and keep "
    "them)";
constexpr int64_t kDedicatedSlabGranularity = int64_t{2} << 20;

int64_t RoundUp(int64_t bytes, int64_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

std::string Quote(std::string_view name) {
  return "'" + std::string(name) + "'";
}

std::string Hex(const void* pointer) {
  char text[32];
  snprintf(text, sizeof(text), "%p", pointer);
  return text;
}

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

// `context` is evaluated only on failure (it may build a string).
#define OFFLOAD_CUDA_RETURN_IF_ERROR(expr, call, context)          \
  do {                                                             \
    cudaError_t offload_cuda_error_ = (expr);                      \
    if (offload_cuda_error_ != cudaSuccess) {                      \
      return CudaErrorStatus(offload_cuda_error_, call, context);  \
    }                                                              \
  } while (false)

// Returns `expr` (a Status) with `context` prefixed if it is not OK;
// `context` is evaluated only then.
#define OFFLOAD_RETURN_IF_ERROR_WITH(expr, context)      \
  do {                                                   \
    ::offload::Status offload_status_ = (expr);          \
    if (!offload_status_.ok()) {                         \
      return offload_status_.WithContext(context);       \
    }                                                    \
  } while (false)

// ---------------------------------------------------------------------------
// Streams and events.

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
  Status CheckHostWait(std::string_view what,
                       std::string_view cuda_call) const;

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
      : owner_(owner), stream_(stream), name_(std::move(name)),
        owned_(owned) {}
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
      return InvalidArgumentError(Where() + "source " + Hex(src) +
                                  " and destination " + Hex(dst) +
                                  " overlap in " + std::to_string(bytes) +
                                  " bytes");
    }
    if (owner_->options_.check_copy_ranges) {
      OFFLOAD_RETURN_IF_ERROR_WITH(
          owner_->CheckCopyRanges(this, dst, src, bytes), Where(bytes));
    }
    OFFLOAD_RETURN_IF_ERROR_WITH(owner_->UseDevice(), Where(bytes));
    OFFLOAD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                        cudaMemcpyDefault, stream_),
        "cudaMemcpyAsync", Where(bytes));
    return OkStatus();
  }

  // Legal during a capture: on a capturing stream the record is captured
  // (the event then stands for a point in the capture).
  Status Record(Event& event) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->owner_ != owner_) {
      return InvalidArgumentError("Record on stream " + Quote(name_) +
                                  ": the event belongs to another backend");
    }
    const uint64_t capture = owner_->CaptureOf(this);
    OFFLOAD_CUDA_RETURN_IF_ERROR(cudaEventRecord(cuda_event->event_, stream_),
                                 "cudaEventRecord",
                                 "Record on stream " + Quote(name_));
    cuda_event->Recorded(this, capture);
    return OkStatus();
  }

  // A stream outside any capture that waits on an event recorded in a
  // running capture joins that capture (as in CUDA).
  Status Wait(const Event& event) override {
    const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->owner_ != owner_) {
      return InvalidArgumentError("Wait on stream " + Quote(name_) +
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
        "cudaStreamWaitEvent", "Wait on stream " + Quote(name_));
    if (event_capture != 0) owner_->JoinCapture(this, event_capture);
    return OkStatus();
  }

  Status Synchronize() override {
    if (owner_->running_captures_.load(std::memory_order_acquire) != 0) {
      OFFLOAD_RETURN_IF_ERROR(owner_->CheckStreamSync(this, name_));
    }
    OFFLOAD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_),
                                 "cudaStreamSynchronize",
                                 "Synchronize stream " + Quote(name_));
    return OkStatus();
  }

  std::string Where() const { return "Copy on stream " + Quote(name_) + ": "; }
  std::string Where(int64_t bytes) const {
    return "Copy of " + std::to_string(bytes) + " bytes on stream " +
           Quote(name_);
  }

  CudaBackend* const owner_;
  const cudaStream_t stream_;
  const std::string name_;
  const bool owned_;
};

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
    OFFLOAD_CUDA_RETURN_IF_ERROR(cudaFreeAsync(data, own->stream_),
                                 "cudaFreeAsync", context());
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
