// See session.h.

#include "python/actoffload/csrc/session.h"

#include <cstring>
#include <string>
#include <utility>

#include "backends/sim/sim_backend.h"

#ifdef ACTOFFLOAD_WITH_CUDA
#include "python/actoffload/csrc/torch_cuda.h"
#endif

namespace actoffload {
namespace {

using offload::Status;

// A torch storage as engine memory. On CUDA the engine reads the storage
// itself; on the simulator it reads the storage's mirror in simulated
// device memory (session.h).
class TorchStorageMemory final : public offload::StorageMemory {
 public:
  TorchStorageMemory(std::shared_ptr<Session> session, c10::Storage storage,
                     offload::Buffer mirror)
      : session_(std::move(session)),
        storage_(std::move(storage)),
        mirror_(std::move(mirror)) {}

  void* data() const override {
    if (released_) return nullptr;
    return mirror_.empty() ? const_cast<void*>(storage_.data())
                          : mirror_.data();
  }
  int64_t size_bytes() const override {
    return released_ ? 0 : static_cast<int64_t>(storage_.nbytes());
  }
  offload::MemorySpace space() const override {
    return offload::MemorySpace::kDevice;
  }
  const offload::Backend* backend() const override {
    return &session_->backend();
  }
  // A torch tensor still views the storage (each holds a reference; this
  // object holds one).
  bool HeldOutside() const override {
    return !released_ && storage_.use_count() > 1;
  }
  Status ReleaseAfter(offload::Stream& stream) override {
    if (released_) {
      return offload::FailedPreconditionError(
          "a torch storage released twice");
    }
    if (!mirror_.empty()) {
      OFFLOAD_RETURN_IF_ERROR(session_->backend().Free(mirror_, stream));
    } else {
      OFFLOAD_RETURN_IF_ERROR(session_->RecordStream(storage_, stream));
    }
    storage_ = c10::Storage();
    released_ = true;
    return offload::OkStatus();
  }

  const c10::Storage& storage() const { return storage_; }

 private:
  std::shared_ptr<Session> session_;  // outlives the mirror
  c10::Storage storage_;
  offload::Buffer mirror_;
  bool released_ = false;
};

// What a reloaded torch storage's DataPtr owns: the engine storage (and the
// session whose backend owns its memory, destroyed after it).
struct PoppedContext {
  std::shared_ptr<Session> session;
  std::shared_ptr<offload::Storage> storage;
};

void DeletePoppedContext(void* context) {
  delete static_cast<PoppedContext*>(context);
}

}  // namespace

std::shared_ptr<Session> Session::Create(const SessionOptions& options) {
  std::shared_ptr<Session> session(new Session(options));
  ThrowIfError(session->Init());
  return session;
}

Session::Session(const SessionOptions& options) : options_(options) {}

Session::~Session() {
  // Engine objects and popped tensors hold the session; when it goes, only
  // memory the backend owns outright is left. Let queued work finish.
  if (sim_ != nullptr) sim_->RunUntilIdle();
#ifdef ACTOFFLOAD_WITH_CUDA
  if (sim_ == nullptr && backend_ != nullptr) {
    (void)TorchCudaSynchronize(*backend_);
  }
#endif
}

Status Session::Init() {
  if (options_.kind == "sim") {
    offload::SimOptions sim;
    sim.seed = options_.seed;
    sim.d2h_gbps = sim.h2d_gbps = options_.sim_gbps;
    sim.device_capacity_bytes = options_.sim_device_bytes;
    sim.record_trace = false;
    std::unique_ptr<offload::SimBackend> backend = offload::NewSimBackend(sim);
    sim_ = backend.get();
    backend_ = std::move(backend);
    device_ = c10::Device(c10::kCPU);
    return offload::OkStatus();
  }
  if (options_.kind == "cuda") {
#ifdef ACTOFFLOAD_WITH_CUDA
    OFFLOAD_ASSIGN_OR_RETURN(
        backend_, NewTorchCudaBackend(options_.device,
                                      options_.pinned_slab_bytes,
                                      &compute_handle_));
    device_ = c10::Device(c10::kCUDA,
                          static_cast<c10::DeviceIndex>(options_.device));
    return offload::OkStatus();
#else
    return offload::UnavailableError(
        "actoffload was built without CUDA (no CUDA toolkit or no GPU when "
        "it was compiled); only the simulated GPU ('sim') is available");
#endif
  }
  return offload::InvalidArgumentError("unknown backend '" + options_.kind +
                                       "' (expected 'sim' or 'cuda')");
}

bool Session::EngineDType(at::ScalarType dtype, offload::DType* out) {
  using offload::DType;
  switch (dtype) {
    case at::kFloat: *out = DType::kF32; return true;
    case at::kBFloat16: *out = DType::kBF16; return true;
    case at::kHalf: *out = DType::kF16; return true;
    case at::kByte: *out = DType::kU8; return true;
    case at::kInt: *out = DType::kI32; return true;
    case at::kLong: *out = DType::kI64; return true;
    default: break;
  }
  // Others move as bytes of their size; ToTorch restores the dtype.
  switch (c10::elementSize(dtype)) {
    case 1: *out = DType::kU8; return true;
    case 2: *out = DType::kF16; return true;
    case 4: *out = DType::kI32; return true;
    case 8: *out = DType::kI64; return true;
    default: return false;
  }
}

std::shared_ptr<offload::Storage> Session::StorageFor(const at::Tensor& tensor) {
  const c10::Storage& storage = tensor.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  auto it = pushed_.find(key);
  if (it != pushed_.end()) {
    if (std::shared_ptr<offload::Storage> live = it->second.lock()) return live;
  }
  offload::Buffer mirror;
  if (sim_ != nullptr) {
    // The storage's device copy, written by a kernel on the compute stream
    // (its producer: the hazard detector checks that copies wait for it).
    const int64_t bytes = static_cast<int64_t>(storage.nbytes());
    offload::Stream& compute = backend_->ComputeStream();
    mirror = ValueOrThrow(backend_->AllocateDevice(bytes, compute));
    uint8_t* host = ValueOrThrow(sim_->MutableBytes(mirror.data(), bytes));
    std::memcpy(host, storage.data(), static_cast<size_t>(bytes));
    offload::SimKernel kernel;
    kernel.name = "torch op";
    kernel.duration_ns = 1000;
    kernel.writes.push_back({mirror.data(), bytes});
    ThrowIfError(sim_->EnqueueKernel(compute, std::move(kernel)));
  }
  auto made = std::make_shared<offload::Storage>(
      std::make_unique<TorchStorageMemory>(shared_from_this(), storage,
                                           std::move(mirror)));
  pushed_[key] = made;
  if (++inserts_since_prune_ >= 1024) PruneMaps();
  return made;
}

offload::Tensor Session::ToEngine(const at::Tensor& tensor,
                                  const offload::TensorFlags& flags,
                                  std::shared_ptr<offload::Event> ready) {
  offload::Tensor out;
  if (!EngineDType(tensor.scalar_type(), &out.dtype)) {
    throw EngineError(offload::InvalidArgumentError(
        "a tensor of dtype " + std::string(c10::toString(tensor.scalar_type())) +
        " cannot be offloaded"));
  }
  out.storage = StorageFor(tensor);
  out.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  out.strides.assign(tensor.strides().begin(), tensor.strides().end());
  out.offset = tensor.storage_offset();
  out.flags = flags;
  out.ready = std::move(ready);
  return out;
}

at::Tensor Session::ToTorch(const offload::Tensor& tensor,
                            at::ScalarType dtype) {
  if (tensor.storage == nullptr) {
    throw EngineError(offload::InternalError("the engine popped no storage"));
  }
  auto options = at::TensorOptions().dtype(dtype).device(device_);
  c10::Storage storage;
  if (auto* memory =
          dynamic_cast<const TorchStorageMemory*>(&tensor.storage->memory())) {
    // Never moved: the original torch storage.
    storage = memory->storage();
  } else {
    auto it = popped_.find(tensor.storage.get());
    if (it != popped_.end()) {
      c10::intrusive_ptr<c10::StorageImpl> live = it->second.lock();
      if (live) storage = c10::Storage(std::move(live));
    }
    if (!storage) {
      void* data = tensor.storage->data();
      const int64_t bytes = tensor.storage->size_bytes();
      if (sim_ != nullptr) {
        data = ValueOrThrow(sim_->MutableBytes(data, bytes));
      }
      auto* context = new PoppedContext{shared_from_this(), tensor.storage};
      at::DataPtr data_ptr(data, context, &DeletePoppedContext, device_);
      storage = c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                             std::move(data_ptr), /*allocator=*/nullptr,
                             /*resizable=*/false);
      popped_.insert_or_assign(tensor.storage.get(),
                               storage.getWeakStorageImpl());
      if (++inserts_since_prune_ >= 1024) PruneMaps();
    }
  }
  if (!storage) {
    throw EngineError(offload::InternalError("popped tensor has no storage"));
  }
  // The tensor over that storage, made directly (at::empty + set_ go
  // through the dispatcher and, on CUDA, the caching allocator: microseconds
  // per pop, SPEC's host cost).
  (void)options;
  c10::DispatchKeySet keys(device_.is_cuda() ? c10::DispatchKey::CUDA
                                             : c10::DispatchKey::CPU);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), keys, caffe2::TypeMeta::fromScalarType(dtype));
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(tensor.shape, tensor.strides);
  impl->set_storage_offset(tensor.offset);
  return out;
}

void Session::PruneMaps() {
  inserts_since_prune_ = 0;
  for (auto it = pushed_.begin(); it != pushed_.end();) {
    it = it->second.expired() ? pushed_.erase(it) : std::next(it);
  }
  for (auto it = popped_.begin(); it != popped_.end();) {
    it = it->second.expired() ? popped_.erase(it) : std::next(it);
  }
}

void Session::SyncComputeForHost() {
  if (sim_ != nullptr) ThrowIfError(backend_->ComputeStream().Synchronize());
}

offload::Stream* Session::WrapStream(int64_t handle) {
  auto it = wrapped_streams_.find(handle);
  if (it != wrapped_streams_.end()) return it->second;
#ifdef ACTOFFLOAD_WITH_CUDA
  if (sim_ == nullptr) {
    offload::Stream* stream = ValueOrThrow(TorchWrapStream(*backend_, handle));
    wrapped_streams_.emplace(handle, stream);
    return stream;
  }
#endif
  (void)handle;
  throw EngineError(offload::InvalidArgumentError(
      "offload_stream needs the CUDA backend (this session is '" +
      options_.kind + "')"));
}

std::shared_ptr<offload::Event> Session::RecordReady() {
  std::shared_ptr<offload::Event> event = ValueOrThrow(backend_->NewEvent());
  ThrowIfError(backend_->ComputeStream().Record(*event));
  return event;
}

std::vector<std::string> Session::Hazards() const {
  std::vector<std::string> out;
  if (sim_ == nullptr) return out;
  for (const auto& hazard : sim_->hazards()) out.push_back(hazard.ToString());
  return out;
}

int64_t Session::SimDeviceLiveBytes() const {
  return sim_ == nullptr ? 0 : sim_->device_memory().live_bytes;
}
int64_t Session::SimDevicePeakBytes() const {
  return sim_ == nullptr ? 0 : sim_->device_memory().peak_bytes;
}
void Session::SimResetPeaks() {
  if (sim_ != nullptr) sim_->ResetPeaks();
}
int64_t Session::SimNowNs() const { return sim_ == nullptr ? 0 : sim_->NowNs(); }

void Session::Synchronize() {
  if (sim_ != nullptr) {
    sim_->RunUntilIdle();
    return;
  }
#ifdef ACTOFFLOAD_WITH_CUDA
  ThrowIfError(TorchCudaSynchronize(*backend_));
#endif
}

Status Session::RecordStream(const c10::Storage& storage,
                             offload::Stream& stream) {
#ifdef ACTOFFLOAD_WITH_CUDA
  return TorchRecordStream(*backend_, storage, stream);
#else
  (void)storage;
  (void)stream;
  return offload::InternalError("record_stream without CUDA");
#endif
}

}  // namespace actoffload
