#include "bench/call_counter.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>

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
};
Counts g_counts;

Counts Snapshot() {
  Counts c = g_counts;
  c.calls[kMemcpyAsync] = GlobalCopyTimer().calls;
  return c;
}

// Calls of one step at k, counted.
Counts CountedStep(GpuExec& ex, CudaBackend& be, const Flags& flags, int k,
                   int64_t* offloaded) {
  const Shape& s = flags.shape;
  OffloadOptions oo;
  oo.model_layers = s.layers;
  oo.offloaded_layers = k;
  oo.retain_pinned_buffers = flags.retain;
  auto off = Must(Offloader::Create(be, oo), "Offloader::Create");
  for (int w = 0; w < flags.warmup; ++w) RunStep(ex, *off, s);
  Cuda(cudaDeviceSynchronize(), "sync");
  CopyTimer& copies = GlobalCopyTimer();
  const bool timing = copies.enabled;
  copies.enabled = false;
  const int64_t offloaded0 = off->stats().tensors_offloaded;
  const Counts before = Snapshot();
  RunStep(ex, *off, s);
  const Counts after = Snapshot();
  copies.enabled = timing;
  *offloaded = off->stats().tensors_offloaded - offloaded0;
  Cuda(cudaDeviceSynchronize(), "sync");
  Counts step;
  for (int c = 0; c < kCudaCalls; ++c) {
    step.calls[c] = after.calls[c] - before.calls[c];
  }
  return step;
}

}  // namespace

std::vector<CallCountRow> MeasureCallCounts(GpuExec& ex, CudaBackend& be,
                                            const Flags& flags) {
  std::vector<CallCountRow> rows;
  int64_t none = 0;
  const Counts base = CountedStep(ex, be, flags, 0, &none);
  for (int k = 1; k <= flags.kmax; ++k) {
    CallCountRow row;
    row.k = k;
    const Counts at = CountedStep(ex, be, flags, k, &row.offloaded);
    for (int c = 0; c < kCudaCalls && row.offloaded > 0; ++c) {
      row.per_tensor[c] =
          double(at.calls[c] - base.calls[c]) / double(row.offloaded);
      if (c != kGetDevice) row.total += row.per_tensor[c];
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
    std::printf("| %d | %lld |", row.k, (long long)row.offloaded);
    for (double v : row.per_tensor) std::printf(" %.2f |", v);
    std::printf(" %.2f |\n", row.total);
  }
}

}  // namespace offload::bench

using offload::bench::g_counts;

extern "C" {

cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t* event,
                                            unsigned int flags) {
  ++g_counts.calls[offload::bench::kEventCreate];
  return __real_cudaEventCreateWithFlags(event, flags);
}

cudaError_t __wrap_cudaEventDestroy(cudaEvent_t event) {
  ++g_counts.calls[offload::bench::kEventDestroy];
  return __real_cudaEventDestroy(event);
}

cudaError_t __wrap_cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ++g_counts.calls[offload::bench::kEventRecord];
  return __real_cudaEventRecord(event, stream);
}

cudaError_t __wrap_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                       unsigned int flags) {
  ++g_counts.calls[offload::bench::kStreamWaitEvent];
  return __real_cudaStreamWaitEvent(stream, event, flags);
}

cudaError_t __wrap_cudaEventQuery(cudaEvent_t event) {
  ++g_counts.calls[offload::bench::kEventQuery];
  return __real_cudaEventQuery(event);
}

cudaError_t __wrap_cudaMallocFromPoolAsync(void** ptr, size_t size,
                                           cudaMemPool_t pool,
                                           cudaStream_t stream) {
  ++g_counts.calls[offload::bench::kMallocFromPool];
  return __real_cudaMallocFromPoolAsync(ptr, size, pool, stream);
}

cudaError_t __wrap_cudaFreeAsync(void* ptr, cudaStream_t stream) {
  ++g_counts.calls[offload::bench::kFreeAsync];
  return __real_cudaFreeAsync(ptr, stream);
}

cudaError_t __wrap_cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  ++g_counts.calls[offload::bench::kHostAlloc];
  return __real_cudaHostAlloc(ptr, size, flags);
}

cudaError_t __wrap_cudaGetDevice(int* device) {
  ++g_counts.calls[offload::bench::kGetDevice];
  return __real_cudaGetDevice(device);
}

}  // extern "C"
