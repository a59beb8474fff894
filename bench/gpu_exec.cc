#include "bench/gpu_exec.h"

#include <library_types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/cuda_check.h"

namespace offload::bench {
namespace {

// The static input's values: bf16 uniform in [-kInputScale, kInputScale].
constexpr double kInputScale = 1.7;

void Blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    Die(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
  }
}

}  // namespace

GpuExec::GpuExec(CudaBackend& be, const Shape& s) : be_(be), s_(s) {
  stream_ = Must(be.NativeStream(be.ComputeStream()), "NativeStream");
  Blas(cublasCreate(&blas_), "cublasCreate");
  Blas(cublasSetStream(blas_, stream_), "cublasSetStream");
  Cuda(cudaMalloc(&workspace_, kWorkspace), "cudaMalloc workspace");
  Blas(cublasSetWorkspace(blas_, workspace_, kWorkspace), "SetWorkspace");
  const int64_t H = s.hidden, T = s.tokens;
  const int64_t wsize[5] = {H * 3 * H, 3 * H * H, H * H, H * 4 * H,
                            4 * H * H};
  const int64_t fan_in[5] = {H, 3 * H, H, H, 4 * H};
  uint64_t seed = 12345;
  for (int w = 0; w < 5; ++w) {
    weights_[w] = DeviceRandom(wsize[w], std::sqrt(3.0 / fan_in[w]), seed++);
    wbytes_[w] = wsize[w] * 2;
  }
  grads_.resize(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    for (int w = 0; w < 5; ++w) {
      Cuda(cudaMalloc(&grads_[l][w], wbytes_[w]), "cudaMalloc grad");
    }
  }
  input_ = DeviceRandom(T * H, kInputScale, kInputSeed);  // after 5 weights
  seed = kInputSeed + 1;
  const int64_t wk[7] = {T * H, T * H, T * H, T * 4 * H, T * H, T * H,
                         T * 3 * H};
  work_[0] = DeviceRandom(T * H, 1.0, seed++);
  for (int i = 1; i < 7; ++i) {
    Cuda(cudaMalloc(&work_[i], wk[i] * 2), "cudaMalloc work");
  }
  Cuda(cudaHostAlloc(&out_host_, T * H * 2, cudaHostAllocDefault),
       "cudaHostAlloc out");
  Cuda(cudaHostAlloc(&stage_, 4 * H * H * 2, cudaHostAllocDefault),
       "cudaHostAlloc stage");
  Cuda(cudaDeviceSynchronize(), "init sync");
}

GpuExec::~GpuExec() {
  cudaDeviceSynchronize();
  for (void* w : weights_) cudaFree(w);
  for (auto& g : grads_) for (void* p : g) cudaFree(p);
  for (void* w : work_) cudaFree(w);
  cudaFree(input_);
  cudaFree(workspace_);
  cudaFreeHost(out_host_);
  cudaFreeHost(stage_);
  for (auto& e : calib_events_) cudaEventDestroy(e);
  cublasDestroy(blas_);
}

void GpuExec::Run(int id, int layer, const Gemm& g, std::vector<const Tensor*>,
                  const Tensor*) {
  if (calibrate_) {
    // Timing events and pool reads are host work of an eager step.
    if (be_.IsCapturing(be_.ComputeStream())) {
      Die("GpuExec: calibration during a graph capture");
    }
    calib_bytes_.push_back(
        sample_bytes_ ? Must(be_.stats(), "stats").device_bytes_in_use : -1);
    Cuda(cudaEventRecord(CalibEvent(), stream_), "record");
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major: C^T[N,M] = op(B)^T op(A)^T.
  const int lda = g.ta ? g.m : g.k;  // A stored [M,K] or [K,M]
  const int ldb = g.tb ? g.k : g.n;  // B stored [K,N] or [N,K]
  Blas(cublasGemmEx(blas_, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                    g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.n), int(g.m),
                    int(g.k), &alpha, g.b, CUDA_R_16BF, ldb, g.a, CUDA_R_16BF,
                    lda, &beta, g.c, CUDA_R_16BF, int(g.n),
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       kGemmNames[id]);
  if (calibrate_) {
    Cuda(cudaEventRecord(CalibEvent(), stream_), "record");
    calib_ids_.push_back(id);
    calib_layers_.push_back(layer);
  }
}

void GpuExec::FillInput(const Tensor& x0) {
  Cuda(cudaMemcpyAsync(Ptr(x0), input_, x0.nbytes(), cudaMemcpyDeviceToDevice,
                       stream_),
       "fill input");
}

void GpuExec::Output(const Tensor& y) {
  if (!capture_) return;
  Cuda(cudaMemcpyAsync(out_host_, Ptr(y), y.nbytes(), cudaMemcpyDeviceToHost,
                       stream_),
       "copy output");
}

void GpuExec::StartCalibration() {
  calibrate_ = true;
  calib_next_ = 0;
  calib_ids_.clear();
  calib_layers_.clear();
  calib_bytes_.clear();
}

void GpuExec::EndCalibration(
    std::array<std::vector<double>, kGemms>& samples) {
  Cuda(cudaDeviceSynchronize(), "sync");
  for (size_t i = 0; i < calib_ids_.size(); ++i) {
    float ms = 0;
    Cuda(cudaEventElapsedTime(&ms, calib_events_[2 * i],
                              calib_events_[2 * i + 1]),
         "elapsed");
    samples[calib_ids_[i]].push_back(ms * 1e6);
  }
  calibrate_ = false;
}

std::vector<GpuExec::TimedGemm> GpuExec::LastCalibration() const {
  std::vector<TimedGemm> out(calib_ids_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = {calib_ids_[i], calib_layers_[i], calib_events_[2 * i],
              calib_events_[2 * i + 1], calib_bytes_[i]};
  }
  return out;
}

std::vector<uint64_t> GpuExec::Hashes() {
  Cuda(cudaDeviceSynchronize(), "sync");
  std::vector<uint64_t> h;
  h.push_back(HashBytes(out_host_, s_.tokens * s_.hidden * 2));
  for (int l = 0; l < s_.layers; ++l) {
    for (int w = 0; w < 5; ++w) {
      Cuda(cudaMemcpy(stage_, grads_[l][w], wbytes_[w],
                      cudaMemcpyDeviceToHost),
           "copy grad");
      h.push_back(HashBytes(stage_, wbytes_[w]));
    }
  }
  return h;
}

GpuExec::StepBytes GpuExec::ReadResults() {
  Cuda(cudaDeviceSynchronize(), "sync");
  StepBytes r;
  const size_t out_bytes = size_t(s_.tokens * s_.hidden * 2);
  r.output.assign(static_cast<const uint8_t*>(out_host_),
                  static_cast<const uint8_t*>(out_host_) + out_bytes);
  for (int l = 0; l < s_.layers; ++l) {
    for (int w = 0; w < 5; ++w) {
      std::vector<uint8_t> g(size_t(wbytes_[w]));
      Cuda(cudaMemcpy(g.data(), grads_[l][w], g.size(),
                      cudaMemcpyDeviceToHost),
           "copy grad");
      r.grads.push_back(std::move(g));
    }
  }
  return r;
}

void GpuExec::ClearResults() {
  Cuda(cudaStreamSynchronize(stream_), "sync");  // a step may still copy
  std::memset(out_host_, 0, size_t(s_.tokens * s_.hidden * 2));
  for (auto& g : grads_) {
    for (int w = 0; w < 5; ++w) {
      Cuda(cudaMemsetAsync(g[w], 0, wbytes_[w], stream_), "clear grad");
    }
  }
  Cuda(cudaStreamSynchronize(stream_), "sync");
}

void GpuExec::SetInput(uint64_t seed) {
  const int64_t n = s_.tokens * s_.hidden;
  const std::vector<uint16_t> h = HostRandom(n, kInputScale, seed);
  // On the compute stream: after every earlier step or launch that reads
  // the input (the backend's streams do not synchronize with cudaMemcpy's
  // legacy stream); the host waits before `h` goes away.
  Cuda(cudaMemcpyAsync(input_, h.data(), n * 2, cudaMemcpyHostToDevice,
                       stream_),
       "write input");
  Cuda(cudaStreamSynchronize(stream_), "sync");
}

std::vector<uint16_t> GpuExec::HostRandom(int64_t n, double scale,
                                          uint64_t seed) {
  std::vector<uint16_t> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    float f = float(((x >> 40) * (1.0 / 16777216.0) * 2 - 1) * scale);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h[i] = uint16_t(bits >> 16);
  }
  return h;
}

void* GpuExec::DeviceRandom(int64_t n, double scale, uint64_t seed) {
  const std::vector<uint16_t> h = HostRandom(n, scale, seed);
  void* d = nullptr;
  Cuda(cudaMalloc(&d, n * 2), "cudaMalloc");
  Cuda(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
  return d;
}

cudaEvent_t GpuExec::CalibEvent() {
  if (calib_next_ == calib_events_.size()) {
    cudaEvent_t e;
    Cuda(cudaEventCreate(&e), "cudaEventCreate");
    calib_events_.push_back(e);
  }
  return calib_events_[calib_next_++];
}

uint64_t GraphMemory(int device) {
  uint64_t high = 0, current = 0;
  Cuda(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh,
                                      &high),
       "graph UsedMemHigh");
  Cuda(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent,
                                      &current),
       "graph UsedMemCurrent");
  return std::max(high, current);
}

void ResetGraphMemoryHigh(int device) {
  uint64_t zero = 0;
  Cuda(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh,
                                      &zero),
       "reset graph UsedMemHigh");
}

}  // namespace offload::bench
