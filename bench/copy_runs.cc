#include "bench/copy_runs.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/cuda_check.h"

namespace offload::bench {
namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The figures of a run of `count` copies of `bytes` in each measured
// direction, started at `start`, all enqueued by `enqueued`, completed at
// `d2h_end` and `h2d_end`.
Sample Figures(int64_t bytes, int64_t count, bool d2h, bool h2d,
               Clock::time_point start, Clock::time_point enqueued,
               Clock::time_point d2h_end, Clock::time_point h2d_end) {
  const double total = static_cast<double>(bytes) * count;
  Sample sample;
  if (d2h) sample.d2h_gbps = total / Seconds(d2h_end - start) / 1e9;
  if (h2d) sample.h2d_gbps = total / Seconds(h2d_end - start) / 1e9;
  sample.enqueue_us_per_copy = Seconds(enqueued - start) * 1e6 /
                               static_cast<double>(count * (d2h + h2d));
  return sample;
}

// Polls `d2h_done()` and `h2d_done()` (for the directions measured) until
// both are true, and notes when each became true.
template <typename D2HDone, typename H2DDone>
void PollUntilDone(bool d2h, bool h2d, D2HDone d2h_done, H2DDone h2d_done,
                   Clock::time_point* d2h_end, Clock::time_point* h2d_end) {
  bool d2h_pending = d2h, h2d_pending = h2d;
  while (d2h_pending || h2d_pending) {
    if (d2h_pending && d2h_done()) {
      *d2h_end = Clock::now();
      d2h_pending = false;
    }
    if (h2d_pending && h2d_done()) {
      *h2d_end = Clock::now();
      h2d_pending = false;
    }
  }
}

// Adds the microseconds since `since` to `*sum` and raises `*max` to them.
void AddTime(double* sum, double* max, Clock::time_point since) {
  const double us = Seconds(Clock::now() - since) * 1e6;
  *sum += us;
  *max = std::max(*max, us);
}

// Turns the sums of `t` into means over `count` copies.
void PerCopy(CallTimes* t, int64_t count) {
  t->alloc_us /= count;
  t->copy_us /= count;
  t->free_us /= count;
}

bool RawDone(cudaEvent_t event) {
  const cudaError_t error = cudaEventQuery(event);
  if (error == cudaErrorNotReady) return false;
  Cuda(error, "cudaEventQuery");
  return true;
}

}  // namespace

const char* DirectionName(Direction d) {
  switch (d) {
    case Direction::kD2H:
      return "D2H";
    case Direction::kH2D:
      return "H2D";
    case Direction::kBoth:
      return "both";
  }
  return "?";
}

std::string SizeName(int64_t bytes) {
  if (bytes >= kMiB) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes / kKiB) + " KiB";
}

// ---------------------------------------------------------------------------
// Raw CUDA.

RawCopies::RawCopies(int64_t max_bytes) {
  Cuda(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking),
       "cudaStreamCreateWithFlags");
  Cuda(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking),
       "cudaStreamCreateWithFlags");
  Cuda(cudaEventCreateWithFlags(&d2h_done_, cudaEventDisableTiming),
       "cudaEventCreateWithFlags");
  Cuda(cudaEventCreateWithFlags(&h2d_done_, cudaEventDisableTiming),
       "cudaEventCreateWithFlags");
  Cuda(cudaMalloc(&dev_src_, max_bytes), "cudaMalloc");
  Cuda(cudaMalloc(&dev_dst_, max_bytes), "cudaMalloc");
  Cuda(cudaHostAlloc(&host_src_, max_bytes, cudaHostAllocDefault),
       "cudaHostAlloc");
  Cuda(cudaHostAlloc(&host_dst_, max_bytes, cudaHostAllocDefault),
       "cudaHostAlloc");
  std::memset(host_src_, 0x5a, max_bytes);
  Cuda(cudaMemset(dev_src_, 0xa5, max_bytes), "cudaMemset");
  Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

RawCopies::~RawCopies() {
  if (ring_ != nullptr) cudaFreeHost(ring_);
  cudaFree(dev_src_);
  cudaFree(dev_dst_);
  cudaFreeHost(host_src_);
  cudaFreeHost(host_dst_);
  cudaEventDestroy(d2h_done_);
  cudaEventDestroy(h2d_done_);
  cudaStreamDestroy(d2h_);
  cudaStreamDestroy(h2d_);
}

Sample RawCopies::Run(Direction dir, int64_t bytes, int64_t count) {
  const bool d2h = dir != Direction::kH2D, h2d = dir != Direction::kD2H;
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    if (d2h) {
      Cuda(cudaMemcpyAsync(host_dst_, dev_src_, bytes, cudaMemcpyDefault, d2h_),
           "cudaMemcpyAsync");
    }
    if (h2d) {
      Cuda(cudaMemcpyAsync(dev_dst_, host_src_, bytes, cudaMemcpyDefault, h2d_),
           "cudaMemcpyAsync");
    }
  }
  if (d2h) Cuda(cudaEventRecord(d2h_done_, d2h_), "cudaEventRecord");
  if (h2d) Cuda(cudaEventRecord(h2d_done_, h2d_), "cudaEventRecord");
  const Clock::time_point enqueued = Clock::now();
  Clock::time_point d2h_end = start, h2d_end = start;
  PollUntilDone(
      d2h, h2d, [&] { return RawDone(d2h_done_); },
      [&] { return RawDone(h2d_done_); }, &d2h_end, &h2d_end);
  return Figures(bytes, count, d2h, h2d, start, enqueued, d2h_end, h2d_end);
}

Sample RawCopies::RunD2HRing(int64_t bytes, int64_t count) {
  if (ring_bytes_ < bytes * count) {
    if (ring_ != nullptr) Cuda(cudaFreeHost(ring_), "cudaFreeHost");
    ring_bytes_ = bytes * count;
    Cuda(cudaHostAlloc(&ring_, ring_bytes_, cudaHostAllocDefault),
         "cudaHostAlloc");
  }
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    Cuda(cudaMemcpyAsync(static_cast<char*>(ring_) + i * bytes, dev_src_, bytes,
                         cudaMemcpyDefault, d2h_),
         "cudaMemcpyAsync");
  }
  Cuda(cudaEventRecord(d2h_done_, d2h_), "cudaEventRecord");
  const Clock::time_point enqueued = Clock::now();
  while (!RawDone(d2h_done_)) {
  }
  const Clock::time_point end = Clock::now();
  return Figures(bytes, count, true, false, start, enqueued, end, start);
}

// ---------------------------------------------------------------------------
// Through the Backend interface.

BackendCopies::BackendCopies(int64_t max_bytes, const CudaOptions& options)
    : backend_(Must(NewCudaBackend(options), "NewCudaBackend")) {
  d2h_ = Must(backend_->NewStream("d2h"), "NewStream");
  h2d_ = Must(backend_->NewStream("h2d"), "NewStream");
  d2h_done_ = Must(backend_->NewEvent(), "NewEvent");
  h2d_done_ = Must(backend_->NewEvent(), "NewEvent");
  Stream& compute = backend_->ComputeStream();
  dev_src_ =
      Must(backend_->AllocateDevice(max_bytes, compute), "AllocateDevice");
  dev_dst_ =
      Must(backend_->AllocateDevice(max_bytes, compute), "AllocateDevice");
  host_src_ = Must(backend_->AllocatePinned(max_bytes), "AllocatePinned");
  host_dst_ = Must(backend_->AllocatePinned(max_bytes), "AllocatePinned");
  std::memset(host_src_.data(), 0x5a, max_bytes);
  Must(compute.Copy(dev_src_.data(), host_src_.data(), max_bytes), "Copy");
  // The copy streams use memory allocated on compute: ordered by this.
  Must(compute.Synchronize(), "Synchronize");
}

BackendCopies::~BackendCopies() {
  Must(d2h_->Synchronize(), "Synchronize");
  Must(h2d_->Synchronize(), "Synchronize");
  Must(backend_->ComputeStream().Synchronize(), "Synchronize");
}

void BackendCopies::TimedAllocCopyFree(int64_t bytes, CallTimes* t) {
  Clock::time_point a = Clock::now();
  Buffer host = Must(backend_->AllocatePinned(bytes), "AllocatePinned");
  AddTime(&t->alloc_us, &t->max_alloc_us, a);
  a = Clock::now();
  Must(d2h_->Copy(host.data(), dev_src_.data(), bytes), "Copy");
  AddTime(&t->copy_us, &t->max_copy_us, a);
  a = Clock::now();
  Must(backend_->Free(host, *d2h_), "Free");
  AddTime(&t->free_us, &t->max_free_us, a);
}

Sample BackendCopies::Run(Direction dir, int64_t bytes, int64_t count,
                          bool allocate) {
  const bool d2h = dir != Direction::kH2D, h2d = dir != Direction::kD2H;
  CallTimes t;
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    if (d2h && allocate) {
      TimedAllocCopyFree(bytes, &t);
    } else if (d2h) {
      Must(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes), "Copy");
    }
    if (h2d && allocate) {
      Buffer device =
          Must(backend_->AllocateDevice(bytes, *h2d_), "AllocateDevice");
      Must(h2d_->Copy(device.data(), host_src_.data(), bytes), "Copy");
      Must(backend_->Free(device, *h2d_), "Free");
    } else if (h2d) {
      Must(h2d_->Copy(dev_dst_.data(), host_src_.data(), bytes), "Copy");
    }
  }
  if (d2h) Must(d2h_->Record(*d2h_done_), "Record");
  if (h2d) Must(h2d_->Record(*h2d_done_), "Record");
  const Clock::time_point enqueued = Clock::now();
  Clock::time_point d2h_end = start, h2d_end = start;
  PollUntilDone(
      d2h, h2d, [&] { return Must(d2h_done_->Query(), "Query"); },
      [&] { return Must(h2d_done_->Query(), "Query"); }, &d2h_end, &h2d_end);
  if (allocate && d2h) {
    PerCopy(&t, count);
    last_times_ = t;
  }
  return Figures(bytes, count, d2h, h2d, start, enqueued, d2h_end, h2d_end);
}

Sample BackendCopies::RunD2H(D2HVariant variant, int64_t bytes, int64_t count,
                             CallTimes* times) {
  std::vector<Buffer> ring;
  if (variant == D2HVariant::kRing) {
    for (int64_t i = 0; i < count; ++i) {
      ring.push_back(Must(backend_->AllocatePinned(bytes), "AllocatePinned"));
    }
  }
  CallTimes t;
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    switch (variant) {
      case D2HVariant::kFixed:
        Must(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes), "Copy");
        break;
      case D2HVariant::kRing:
        Must(d2h_->Copy(ring[i].data(), dev_src_.data(), bytes), "Copy");
        break;
      case D2HVariant::kFixedRecord:
        Must(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes), "Copy");
        Must(d2h_->Record(*h2d_done_), "Record");
        break;
      case D2HVariant::kAllocTimed:
        TimedAllocCopyFree(bytes, &t);
        break;
    }
  }
  Must(d2h_->Record(*d2h_done_), "Record");
  const Clock::time_point enqueued = Clock::now();
  while (!Must(d2h_done_->Query(), "Query")) {
  }
  const Clock::time_point end = Clock::now();
  if (times != nullptr) {
    PerCopy(&t, count);
    *times = t;
  }
  return Figures(bytes, count, true, false, start, enqueued, end, start);
}

}  // namespace offload::bench
