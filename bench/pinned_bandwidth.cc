#include "bench/pinned_bandwidth.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"

namespace offload::bench {

Bandwidth MeasurePinned(size_t chunk, size_t total) {
  void* host = nullptr;
  void* host2 = nullptr;
  void* dev = nullptr;
  void* dev2 = nullptr;
  Cuda(cudaHostAlloc(&host, chunk, cudaHostAllocDefault), "cudaHostAlloc");
  Cuda(cudaHostAlloc(&host2, chunk, cudaHostAllocDefault), "cudaHostAlloc");
  Cuda(cudaMalloc(&dev, chunk), "cudaMalloc");
  Cuda(cudaMalloc(&dev2, chunk), "cudaMalloc");
  cudaStream_t a, b;
  Cuda(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
  Cuda(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
  cudaEvent_t e[4];
  for (auto& x : e) Cuda(cudaEventCreate(&x), "event");
  const int n = int(std::max<size_t>(1, total / chunk));
  auto run = [&](bool d2h, bool h2d) {
    Cuda(cudaDeviceSynchronize(), "sync");
    cudaEventRecord(e[0], a);
    cudaEventRecord(e[2], b);
    for (int i = 0; i < n; ++i) {
      if (d2h) __real_cudaMemcpyAsync(host, dev, chunk, cudaMemcpyDeviceToHost, a);
      if (h2d) __real_cudaMemcpyAsync(dev2, host2, chunk, cudaMemcpyHostToDevice, b);
    }
    cudaEventRecord(e[1], a);
    cudaEventRecord(e[3], b);
    Cuda(cudaDeviceSynchronize(), "sync");
    float ms_a = 0, ms_b = 0;
    cudaEventElapsedTime(&ms_a, e[0], e[1]);
    cudaEventElapsedTime(&ms_b, e[2], e[3]);
    double bytes = double(chunk) * n;
    return std::pair<double, double>(d2h ? bytes / (ms_a * 1e6) : 0,
                                     h2d ? bytes / (ms_b * 1e6) : 0);
  };
  run(true, true);  // warm-up
  Bandwidth bw;
  std::vector<double> d, h, bd, bh;
  for (int rep = 0; rep < 3; ++rep) {
    d.push_back(run(true, false).first);
    h.push_back(run(false, true).second);
    auto both = run(true, true);
    bd.push_back(both.first);
    bh.push_back(both.second);
  }
  bw.d2h = Median(d);
  bw.h2d = Median(h);
  bw.both_d2h = Median(bd);
  bw.both_h2d = Median(bh);
  for (auto& x : e) cudaEventDestroy(x);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(dev);
  cudaFree(dev2);
  cudaFreeHost(host);
  cudaFreeHost(host2);
  return bw;
}

double PinnedPeak::d2h() const {
  return std::max({mib16.d2h, small.d2h, big.d2h});
}

double PinnedPeak::h2d() const {
  return std::max({mib16.h2d, small.h2d, big.h2d});
}

PinnedPeak MeasurePinnedPeak(size_t span_small) {
  PinnedPeak p;
  p.span_small = span_small;
  p.small = MeasurePinned(span_small, size_t{1} << 30);
  p.mib16 = MeasurePinned(size_t{16} << 20, size_t{1} << 30);
  p.big = MeasurePinned(size_t{256} << 20, size_t{2} << 30);
  return p;
}

}  // namespace offload::bench
