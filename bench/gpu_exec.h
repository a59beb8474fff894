// The layer stack on the real GPU: each GEMM is one bf16 cublasGemmEx
// (compute type 32F) on the CudaBackend's compute stream. The weights, weight
// gradients and backward work buffers come from plain cudaMalloc, so the
// backend's device pool holds only the activations.

#ifndef OFFLOAD_BENCH_GPU_EXEC_H_
#define OFFLOAD_BENCH_GPU_EXEC_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/layer_stack.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace offload::bench {

class GpuExec final : public Exec {
 public:
  // Creates the cuBLAS handle on `be`'s compute stream and fills the weights,
  // the input and the top gradient with fixed pseudo-random bf16 values.
  // Dies on any CUDA or cuBLAS error. `be` must outlive this object.
  GpuExec(CudaBackend& be, const Shape& s);
  ~GpuExec() override;

  Backend& backend() override { return be_; }
  void* weight(int w) override { return weights_[w]; }
  void* grad(int layer, int w) override { return grads_[layer][w]; }
  void* work(int i) override { return work_[i]; }

  void Run(int id, int layer, const Gemm& g, std::vector<const Tensor*>,
           const Tensor*) override;
  void FillInput(const Tensor& x0) override;
  void Output(const Tensor& y) override;

  // Per-GEMM timing of the steps run while calibrating.
  void StartCalibration();
  // Adds this step's per-GEMM durations (ns) to `samples`.
  void EndCalibration(std::array<std::vector<double>, kGemms>& samples);
  void set_capture(bool c) { capture_ = c; }
  // While calibrating, also read the backend's device_bytes_in_use as each
  // GEMM is enqueued (for the timeline's memory curve).
  void set_sample_device_bytes(bool on) { sample_bytes_ = on; }

  // The GEMMs of the last calibrated step, in enqueue order, with their
  // events (valid until the next StartCalibration).
  struct TimedGemm {
    int id = 0, layer = 0;
    cudaEvent_t start = nullptr, end = nullptr;
    int64_t device_bytes = -1;  // at enqueue; -1 when not sampled
  };
  std::vector<TimedGemm> LastCalibration() const;

  // After a step with capture on: the hash of the output and of each weight
  // gradient (host copies).
  std::vector<uint64_t> Hashes();
  cudaStream_t stream() const { return stream_; }

 private:
  static constexpr size_t kWorkspace = size_t{64} << 20;

  // bf16 values uniform in [-scale, scale], made on the host.
  void* DeviceRandom(int64_t n, double scale, uint64_t seed);
  cudaEvent_t CalibEvent();

  CudaBackend& be_;
  Shape s_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  void* weights_[5] = {};
  int64_t wbytes_[5] = {};
  std::vector<std::array<void*, 5>> grads_;
  void* work_[7] = {};
  void* input_ = nullptr;
  void* out_host_ = nullptr;
  void* stage_ = nullptr;
  bool calibrate_ = false;
  bool capture_ = false;
  std::vector<cudaEvent_t> calib_events_;
  size_t calib_next_ = 0;
  std::vector<int> calib_ids_;
  std::vector<int> calib_layers_;
  bool sample_bytes_ = false;
  std::vector<int64_t> calib_bytes_;
};

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_GPU_EXEC_H_
