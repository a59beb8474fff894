#include "bench/call_counter.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "bench/layer_stack.h"
#include "engine/offload.h"

// The runtime's own functions (the linker's names for them under --wrap).
extern "C" {
cudaError_t __real_cudaEventCreateWithFlags(cudaEvent_t* event,
                                            unsigned int flags);
cudaError_t __real_cudaEventDestroy(cudaEvent_t event);
cudaError_t __real_cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t __real_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                       unsigned int flags);
cudaError_t __real_cudaEventQuery(cudaEvent_t event);
cudaError_t __real_cudaMallocFromPoolAsync(void** ptr, size_t size,
                                           cudaMemPool_t pool,
                                           cudaStream_t stream);
cudaError_t __real_cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t __real_cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t __real_cudaGetDevice(int* device);
}

namespace offload::bench {
namespace {

// What the wrappers count: all calls, always (reading it twice brackets a
// step).
struct Counts {
  int64_t calls[kCudaCalls] = {};
  double ns[kCudaCalls] = {};
  double engine_ns = 0;  // CountedStep: host time in Offloader calls
};
Counts g_counts;

Counts Snapshot() {
  Counts c = g_counts;
  c.calls[kMemcpyAsync] = GlobalCopyTimer().calls;
  c.ns[kMemcpyAsync] = GlobalCopyTimer().host_ns;
  return c;
}

// "3" or "budget 4.5".
std::string Label(const CallCountRow& row) {
  char text[32];
  if (row.k >= 0) {
    std::snprintf(text, sizeof(text), "%d", row.k);
  } else {
    std::snprintf(text, sizeof(text), "budget %g", row.budget_k);
  }
  return text;
}

// Runs `real` (a runtime call) and counts and times it as `call`.
template <typename F>
cudaError_t Timed(CudaCall call, F&& real) {
  ++g_counts.calls[call];
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t e = real();
  g_counts.ns[call] += std::chrono::duration<double, std::nano>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
  return e;
}

// Calls of one step at k, counted.
Counts CountedStep(GpuExec& ex, CudaBackend& be, const Flags& flags, int k,
                   double budget_k, int64_t* offloaded) {
  const Shape& s = flags.shape;
  const OffloadOptions oo = BenchOptions(s, k, budget_k, flags.retain);
  auto off = Must(Offloader::Create(be, oo), "Offloader::Create");
  for (int w = 0; w < flags.warmup; ++w) RunStep(ex, *off, s);
  Cuda(cudaDeviceSynchronize(), "sync");
  CopyTimer& copies = GlobalCopyTimer();
  const bool timing = copies.enabled;
  copies.enabled = false;
  const int64_t offloaded0 = off->stats().tensors_offloaded;
  const Counts before = Snapshot();
  const StepCost cost = RunStep(ex, *off, s);
  const Counts after = Snapshot();
  copies.enabled = timing;
  *offloaded = off->stats().tensors_offloaded - offloaded0;
  Cuda(cudaDeviceSynchronize(), "sync");
  Counts step;
  for (int c = 0; c < kCudaCalls; ++c) {
    step.calls[c] = after.calls[c] - before.calls[c];
    step.ns[c] = after.ns[c] - before.ns[c];
  }
  step.engine_ns = cost.engine_host_ns;
  return step;
}

}  // namespace

std::vector<CallCountRow> MeasureCallCounts(GpuExec& ex, CudaBackend& be,
                                            const Flags& flags) {
  std::vector<CallCountRow> rows;
  int64_t none = 0;
  const Counts base = CountedStep(ex, be, flags, 0, -1, &none);
  std::vector<std::pair<int, double>> configs;
  for (int k = 1; k <= flags.kmax; ++k) configs.push_back({k, -1});
  for (double b : flags.budget_k) configs.push_back({-1, b});
  for (const auto& [k, budget_k] : configs) {
    CallCountRow row;
    row.k = k;
    row.budget_k = budget_k;
    const Counts at = CountedStep(ex, be, flags, std::max(k, 0), budget_k,
                                  &row.offloaded);
    for (int c = 0; c < kCudaCalls && row.offloaded > 0; ++c) {
      const double n = double(row.offloaded);
      row.per_tensor[c] = double(at.calls[c] - base.calls[c]) / n;
      if (c != kGetDevice) row.total += row.per_tensor[c];
      row.us_per_tensor[c] = (at.ns[c] - base.ns[c]) / n / 1e3;
      row.us_total += row.us_per_tensor[c];
    }
    if (row.offloaded > 0) {
      row.engine_us_per_tensor =
          (at.engine_ns - base.engine_ns) / double(row.offloaded) / 1e3;
    }
    rows.push_back(row);
  }
  return rows;
}

void PrintCallCounts(const std::vector<CallCountRow>& rows) {
  std::printf("\n## CUDA runtime calls per offloaded tensor (one step at k "
              "minus one at k=0, / tensors offloaded)\n\n| k | tensors |");
  for (const char* name : kCudaCallNames) std::printf(" %s |", name);
  std::printf(" total (no GetDevice) |\n|---|---|");
  for (int c = 0; c < kCudaCalls; ++c) std::printf("---|");
  std::printf("---|\n");
  for (const CallCountRow& row : rows) {
    std::printf("| %s | %lld |", Label(row).c_str(), (long long)row.offloaded);
    for (double v : row.per_tensor) std::printf(" %.2f |", v);
    std::printf(" %.2f |\n", row.total);
  }
  std::printf("\n## Host us in those calls per offloaded tensor (one step at "
              "k minus one at k=0), and in all Offloader calls\n\n| k |");
  for (const char* name : kCudaCallNames) std::printf(" %s |", name);
  std::printf(" runtime total | Offloader calls |\n|---|");
  for (int c = 0; c < kCudaCalls; ++c) std::printf("---|");
  std::printf("---|---|\n");
  for (const CallCountRow& row : rows) {
    std::printf("| %s |", Label(row).c_str());
    for (double v : row.us_per_tensor) std::printf(" %.2f |", v);
    std::printf(" %.2f | %.2f |\n", row.us_total, row.engine_us_per_tensor);
  }
}

}  // namespace offload::bench

extern "C" {

cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t* event,
                                            unsigned int flags) {
  return offload::bench::Timed(offload::bench::kEventCreate, [&] {
    return __real_cudaEventCreateWithFlags(event, flags);
  });
}

cudaError_t __wrap_cudaEventDestroy(cudaEvent_t event) {
  return offload::bench::Timed(offload::bench::kEventDestroy, [&] {
    return __real_cudaEventDestroy(event);
  });
}

cudaError_t __wrap_cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return offload::bench::Timed(offload::bench::kEventRecord, [&] {
    return __real_cudaEventRecord(event, stream);
  });
}

cudaError_t __wrap_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                       unsigned int flags) {
  return offload::bench::Timed(offload::bench::kStreamWaitEvent, [&] {
    return __real_cudaStreamWaitEvent(stream, event, flags);
  });
}

cudaError_t __wrap_cudaEventQuery(cudaEvent_t event) {
  return offload::bench::Timed(offload::bench::kEventQuery, [&] {
    return __real_cudaEventQuery(event);
  });
}

cudaError_t __wrap_cudaMallocFromPoolAsync(void** ptr, size_t size,
                                           cudaMemPool_t pool,
                                           cudaStream_t stream) {
  return offload::bench::Timed(offload::bench::kMallocFromPool, [&] {
    return __real_cudaMallocFromPoolAsync(ptr, size, pool, stream);
  });
}

cudaError_t __wrap_cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return offload::bench::Timed(offload::bench::kFreeAsync, [&] {
    return __real_cudaFreeAsync(ptr, stream);
  });
}

cudaError_t __wrap_cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  return offload::bench::Timed(offload::bench::kHostAlloc, [&] {
    return __real_cudaHostAlloc(ptr, size, flags);
  });
}

cudaError_t __wrap_cudaGetDevice(int* device) {
  return offload::bench::Timed(offload::bench::kGetDevice, [&] {
    return __real_cudaGetDevice(device);
  });
}

}  // extern "C"
