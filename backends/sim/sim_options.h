// The simulated GPU's options and the values it takes and gives
// (sim_backend.h): its options, a byte range of its memory, a kernel of
// fixed duration, and its memory statistics.

#ifndef OFFLOAD_BACKENDS_SIM_SIM_OPTIONS_H_
#define OFFLOAD_BACKENDS_SIM_SIM_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace offload {

struct SimOptions {
  uint64_t seed = 0;
  double d2h_gbps = 55.0, h2d_gbps = 55.0;  // per direction, one engine each
  int64_t copy_latency_ns = 2000;
  int64_t device_capacity_bytes = int64_t{80} << 30;
  int64_t pinned_capacity_bytes = int64_t{512} << 30;
  // Device-to-device (and pinned-to-pinned) copy bandwidth; no engine.
  double d2d_gbps = 2000.0;
  // Each copy and kernel duration is scaled by 1 + u, u drawn uniformly from
  // [-duration_jitter, +duration_jitter] by the seeded RNG. 0 = exact.
  double duration_jitter = 0.0;
  // false: device memory holds no bytes and copies move none; for timing
  // runs of workloads too large to hold in host RAM.
  bool store_bytes = true;
  // false: trace() stays empty (long property runs).
  bool record_trace = true;
};

// A byte range of simulated memory.
struct SimRange {
  const void* data = nullptr;
  int64_t bytes = 0;
};

class SimBackend;

// Device work of a fixed duration, standing in for a model's kernels.
struct SimKernel {
  std::string name;
  int64_t duration_ns = 0;
  std::vector<SimRange> reads;
  std::vector<SimRange> writes;
  // Runs when the kernel completes in device time; may change simulated
  // bytes through SimBackend::MutableBytes. Optional.
  std::function<void(SimBackend&)> body;
};

struct SimMemoryStats {
  int64_t live_bytes = 0;     // allocated and not freed, in device time
  int64_t peak_bytes = 0;     // high-water mark of live_bytes
  int64_t peak_time_ns = 0;   // when the high-water mark was first reached
  int64_t capacity_bytes = 0;
  int64_t allocations = 0;    // number of allocations so far
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_SIM_OPTIONS_H_
