// Link-time interposition of two CUDA runtime calls, for the layer-stack
// benchmark. The library carries -Wl,--wrap=cudaMemcpyAsync and
// -Wl,--wrap=cudaMemPoolCreate, so every call the CudaBackend makes to either
// one lands here first:
//
// - cudaMemcpyAsync: while the copy timer is enabled, each copy enqueued on a
//   stream other than its compute stream is bracketed by two events from the
//   timer's pool (the engine's offload and reload copies). Otherwise the call
//   goes straight through.
// - cudaMemPoolCreate: the pool created last is remembered; it is the
//   backend's device pool, whose UsedMemHigh is the activations' peak.
//
// All of this is single-threaded: only the benchmark's host thread uses it.

#ifndef OFFLOAD_BENCH_COPY_INTERPOSER_H_
#define OFFLOAD_BENCH_COPY_INTERPOSER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

// The runtime's own cudaMemcpyAsync, never timed (the linker's name for it
// under --wrap).
extern "C" cudaError_t __real_cudaMemcpyAsync(void* dst, const void* src,
                                              size_t count, cudaMemcpyKind kind,
                                              cudaStream_t stream);

namespace offload::bench {

// One timed copy.
struct CopyRecord {
  cudaEvent_t start = nullptr, end = nullptr;
  size_t bytes = 0;
  bool d2h = false;
};

// What the cudaMemcpyAsync wrapper reads and fills.
struct CopyTimer {
  bool enabled = false;
  cudaStream_t compute = nullptr;  // copies on this stream are not timed
  std::vector<cudaEvent_t> pool;   // timed events, two per copy
  size_t next = 0;                 // next unused event of `pool`
  std::vector<CopyRecord> records;
  bool overflow = false;  // a copy went untimed: `pool` ran out
  // Every cudaMemcpyAsync through the wrapper, timed or not, and the host
  // time spent in the untimed ones (for call_counter.h, which cannot wrap
  // the call a second time).
  int64_t calls = 0;
  double host_ns = 0;
};

// The one timer the wrapper uses.
CopyTimer& GlobalCopyTimer();

// The memory pool passed to the last successful cudaMemPoolCreate, or nullptr.
cudaMemPool_t SeenMemPool();

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_COPY_INTERPOSER_H_
