// Session: the engine's view of PyTorch. One backend (the simulated GPU, or
// the real one through CudaBackend with PyTorch's caching allocator and
// current stream), and the tensor/storage seam both ways:
//
//  - ToEngine: a torch tensor becomes an offload::Tensor over the same
//    memory (no copy on CUDA). All views of one torch storage share one
//    offload::Storage while the engine holds it, so the engine's span
//    planning (SPEC §2) sees them as one allocation. Its StorageMemory
//    (TorchStorageMemory) reports the storage as held outside while any
//    torch tensor still views it, and releases it after a stream as
//    PyTorch's record_stream does.
//  - ToTorch: a tensor the engine hands back becomes a torch tensor: the
//    original storage if it never moved, else a storage over the reloaded
//    memory, shared by every view popped from it (one torch storage per
//    reloaded span), which keeps the engine's memory alive as long as torch
//    uses it.
//
// On the simulated GPU ("sim"), tensors are CPU tensors standing in for
// device tensors: each pushed storage gets a mirror in simulated device
// memory, written by a simulated kernel on the compute stream at push (so
// the hazard detector sees the producer the copies must wait for), and
// popped tensors are read from simulated memory after the compute stream
// has run to the pop. Everything else (handles, spans, views, ordering,
// budgets) is the engine's real code.

#ifndef ACTOFFLOAD_CSRC_SESSION_H_
#define ACTOFFLOAD_CSRC_SESSION_H_

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {
class SimBackend;
}

namespace actoffload {

// Thrown for a non-OK Status; the binding turns it into
// actoffload.OffloadError carrying the engine's message.
class EngineError : public std::runtime_error {
 public:
  explicit EngineError(const offload::Status& status)
      : std::runtime_error(status.ToString()) {}
};

// Thrown for a status that says the device's memory ran out (the engine's
// AllocateDevice found none: a reload's buffers, the caching allocator's
// own out-of-memory error underneath). The binding turns it into
// actoffload.OffloadOutOfMemoryError: an OffloadError and a
// torch.cuda.OutOfMemoryError, the class a training loop catches to skip a
// batch (run 115: a reload's out-of-memory error escaped such a loop as an
// OffloadError alone).
class EngineOutOfMemoryError : public EngineError {
 public:
  using EngineError::EngineError;
};

inline bool DeviceOutOfMemory(const offload::Status& status) {
  return status.code() == offload::StatusCode::kResourceExhausted &&
         status.message().find("AllocateDevice") != std::string::npos;
}

[[noreturn]] inline void Throw(const offload::Status& status) {
  if (DeviceOutOfMemory(status)) throw EngineOutOfMemoryError(status);
  throw EngineError(status);
}

inline void ThrowIfError(const offload::Status& status) {
  if (!status.ok()) Throw(status);
}
template <typename T>
T ValueOrThrow(offload::StatusOr<T> value) {
  if (!value.ok()) Throw(value.status());
  return std::move(value).value();
}

struct SessionOptions {
  std::string kind = "sim";  // "sim" or "cuda"
  int device = 0;            // CUDA device ordinal
  // Simulated GPU.
  uint64_t seed = 0;
  double sim_gbps = 55.0;
  int64_t sim_device_bytes = int64_t{80} << 30;
  // Pinned slabs of the CUDA backend.
  int64_t pinned_slab_bytes = int64_t{64} << 20;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  static std::shared_ptr<Session> Create(const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  offload::Backend& backend() { return *backend_; }
  bool sim() const { return sim_ != nullptr; }
  const std::string& kind() const { return options_.kind; }
  c10::Device device() const { return device_; }
  // The native handle of the compute stream (cudaStream_t as an integer;
  // 0 on the simulator): PyTorch's current stream when the session was made.
  int64_t compute_stream_handle() const { return compute_handle_; }

  // The engine tensor over `tensor`'s memory. REQUIRES: a strided tensor
  // with elements, on this session's device, of an engine-sized dtype
  // (EngineDType returns true).
  offload::Tensor ToEngine(const at::Tensor& tensor,
                           const offload::TensorFlags& flags,
                           std::shared_ptr<offload::Event> ready);
  // The torch tensor for what the engine popped, of `dtype`.
  at::Tensor ToTorch(const offload::Tensor& tensor, at::ScalarType dtype);
  // Whether a dtype can be offloaded, and its engine dtype.
  static bool EngineDType(at::ScalarType dtype, offload::DType* out);

  // The simulator: runs the compute stream up to what is enqueued on it now
  // (the host "sees" device results, as a CPU op would). No-op on CUDA.
  void SyncComputeForHost();
  // A stream of the backend over the CUDA stream `handle` (a
  // torch.cuda.Stream's cuda_stream; TE's offload_stream), one per handle.
  // Throws on the simulator (it has no CUDA streams).
  offload::Stream* WrapStream(int64_t handle);
  // An event recorded on the compute stream now (TE's start_offload).
  std::shared_ptr<offload::Event> RecordReady();

  // Simulator figures (0 / empty on CUDA).
  std::vector<std::string> Hazards() const;
  int64_t SimDeviceLiveBytes() const;
  int64_t SimDevicePeakBytes() const;
  void SimResetPeaks();
  int64_t SimNowNs() const;
  // Drains every stream (sim: runs to idle; CUDA: synchronizes the device).
  void Synchronize();

  // TorchStorageMemory's release on CUDA: record_stream on `stream`.
  offload::Status RecordStream(const c10::Storage& storage,
                               offload::Stream& stream);

 private:
  explicit Session(const SessionOptions& options);
  offload::Status Init();
  std::shared_ptr<offload::Storage> StorageFor(const at::Tensor& tensor);

  SessionOptions options_;
  c10::Device device_ = c10::Device(c10::kCPU);
  int64_t compute_handle_ = 0;
  std::unique_ptr<offload::Backend> backend_;
  offload::SimBackend* sim_ = nullptr;  // backend_ when it is the simulator

  // Torch storages the engine may hold, so that views share one Storage.
  std::unordered_map<const c10::StorageImpl*,
                     std::weak_ptr<offload::Storage>>
      pushed_;
  // Reloaded engine storages already wrapped for torch.
  std::unordered_map<const offload::Storage*,
                     c10::weak_intrusive_ptr<c10::StorageImpl>>
      popped_;
  int64_t inserts_since_prune_ = 0;
  std::unordered_map<int64_t, offload::Stream*> wrapped_streams_;
  void PruneMaps();
};

}  // namespace actoffload

#endif  // ACTOFFLOAD_CSRC_SESSION_H_
