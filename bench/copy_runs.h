// The measurements of cuda_copy_benchmark: runs of back-to-back copies
// between one device buffer and one pinned buffer, with raw cudaMemcpyAsync
// (RawCopies) and through the Backend interface of a CudaBackend
// (BackendCopies). A run enqueues `count` copies per measured direction on
// two streams, then polls an event per direction until both completed; GB/s
// is bytes / (completion time - start) per direction (GB = 1e9 bytes).
// Failures are fatal (bench_util.h's Die).

#ifndef OFFLOAD_BENCH_COPY_RUNS_H_
#define OFFLOAD_BENCH_COPY_RUNS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "engine/backend.h"

namespace offload::bench {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;

enum class Direction { kD2H, kH2D, kBoth };

// "D2H", "H2D" or "both".
const char* DirectionName(Direction d);

// "64 KiB", "16 MiB": whole MiB from 1 MiB on, else whole KiB.
std::string SizeName(int64_t bytes);

// The figures of one run.
struct Sample {
  double d2h_gbps = 0;  // 0 when the direction was not measured
  double h2d_gbps = 0;
  double enqueue_us_per_copy = 0;  // host time enqueueing, per copy
};

// Host time per kind of call in a +alloc D2H run (diagnostics).
struct CallTimes {
  double alloc_us = 0, copy_us = 0, free_us = 0;  // mean per copy
  double max_alloc_us = 0, max_copy_us = 0, max_free_us = 0;
};

// Raw CUDA: its own non-blocking streams, events and memory (cudaMalloc,
// cudaHostAlloc) for copies of up to `max_bytes`.
class RawCopies {
 public:
  explicit RawCopies(int64_t max_bytes);
  ~RawCopies();
  RawCopies(const RawCopies&) = delete;
  RawCopies& operator=(const RawCopies&) = delete;

  // `count` copies of `bytes` in `dir` (both: on two streams at once).
  Sample Run(Direction dir, int64_t bytes, int64_t count);

  // D2H alone into `count` consecutive pieces of one cudaHostAlloc buffer
  // (distinct destinations, like a pool's pieces), for the diagnostics.
  Sample RunD2HRing(int64_t bytes, int64_t count);

 private:
  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  cudaEvent_t d2h_done_ = nullptr, h2d_done_ = nullptr;
  void* dev_src_ = nullptr;
  void* dev_dst_ = nullptr;
  void* host_src_ = nullptr;
  void* host_dst_ = nullptr;
  void* ring_ = nullptr;
  int64_t ring_bytes_ = 0;
};

// The D2H diagnostics of BackendCopies::RunD2H.
enum class D2HVariant {
  kFixed,        // one destination buffer
  kRing,         // `count` pinned buffers allocated beforehand
  kFixedRecord,  // one destination, and an event recorded after each copy
  kAllocTimed,   // +alloc, with each call timed
};

// The same through the Backend interface: Stream::Copy on two streams of a
// CudaBackend made with `options`, memory from its pools.
class BackendCopies {
 public:
  BackendCopies(int64_t max_bytes, const CudaOptions& options);
  ~BackendCopies();  // synchronizes the streams
  BackendCopies(const BackendCopies&) = delete;
  BackendCopies& operator=(const BackendCopies&) = delete;

  CudaBackend& backend() { return *backend_; }

  // `count` copies of `bytes` in `dir`. With `allocate` (+alloc), every copy
  // also allocates its destination (pinned for D2H, device for H2D) and
  // frees it stream-ordered, as the offload engine does.
  Sample Run(Direction dir, int64_t bytes, int64_t count, bool allocate);

  // Host time of each call in the last +alloc run's D2H side.
  const CallTimes& last_times() const { return last_times_; }

  // D2H alone in one of the diagnostic variants; `times`, when set, gets the
  // calls' host times (kAllocTimed).
  Sample RunD2H(D2HVariant variant, int64_t bytes, int64_t count,
                CallTimes* times);

 private:
  // AllocatePinned, Copy from dev_src_ and Free on d2h_, each timed into `t`.
  void TimedAllocCopyFree(int64_t bytes, CallTimes* t);

  CallTimes last_times_;
  std::unique_ptr<CudaBackend> backend_;
  Stream* d2h_ = nullptr;
  Stream* h2d_ = nullptr;
  std::unique_ptr<Event> d2h_done_, h2d_done_;
  Buffer dev_src_, dev_dst_, host_src_, host_dst_;
};

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_COPY_RUNS_H_
