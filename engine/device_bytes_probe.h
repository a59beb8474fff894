// DeviceBytesProbe: the caller's count of device memory in use, for the
// byte budget (SPEC §4.7, OffloadOptions::device_bytes_probe).
//
// With a probe the budget bounds activation bytes as the user measures
// them: the recorded iteration notes, between the forward's first push and
// the backward's last call, the device bytes in use that the engine's saved
// tensors do not account for (a layer's output, gradients, a recomputed
// layer's tensors), and the plan keeps them within the budget next to the
// saved tensors (engine/plan/budget_plan.h). Without one the budget
// covers saved tensors only.
//
// Implementations: SimBackend::InUseProbe (backends/sim), CudaBackend's
// probe over its own allocations (backends/cuda), or a framework
// allocator's count (a caller's own subclass).

#ifndef OFFLOAD_ENGINE_DEVICE_BYTES_PROBE_H_
#define OFFLOAD_ENGINE_DEVICE_BYTES_PROBE_H_

#include <cstdint>

namespace offload {

class DeviceBytesProbe {
 public:
  DeviceBytesProbe() = default;
  DeviceBytesProbe(const DeviceBytesProbe&) = delete;
  DeviceBytesProbe& operator=(const DeviceBytesProbe&) = delete;
  // Inline, so that the header is the whole target (python/ compiles a
  // listed set of the engine's sources).
  virtual ~DeviceBytesProbe() = default;

  // Device bytes in use now as the user counts them (e.g. a framework
  // allocator's allocated bytes, in host order): everything, the engine's
  // own saved and reloaded tensors included.
  // Success: a count >= 0. Failure: none (a probe that cannot count
  // returns its last count).
  // REQUIRES: called from the thread that drives the Offloader.
  virtual int64_t InUseBytes() = 0;

  // The most bytes in use at any moment since the previous TakePeakBytes
  // (the first call: since the probe was made), and a new high-water mark
  // started from the bytes in use now. Without an override, InUseBytes():
  // the probe then sees only what is alive at the engine's calls, not
  // memory allocated and freed between two of them.
  // Success: a count >= InUseBytes(). Failure: none.
  // REQUIRES: as InUseBytes.
  virtual int64_t TakePeakBytes() { return InUseBytes(); }
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_DEVICE_BYTES_PROBE_H_
