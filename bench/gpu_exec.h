// The layer stack on the real GPU: each GEMM is one bf16 cublasGemmEx
// (compute type 32F) on the CudaBackend's compute stream. The weights, weight
// gradients and backward work buffers come from plain cudaMalloc, so the
// backend's device pool holds only the activations.
//
// A step can be captured into a CUDA graph (CaptureStep, layer_stack.h): the
// GEMMs, the input fill (a device-to-device copy from the static input
// buffer) and, with set_capture(true), the output's copy to pinned host
// memory are all stream work on the compute stream; nothing in a step
// allocates outside the backend or waits on the host. Each weight gradient
// is written whole (beta = 0) by its GEMM in every step, eager or launched.

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
  // Whether Output copies the last layer's output to pinned host memory
  // (read by Hashes and ReadResults). Recorded into a graph captured while
  // on: every launch of it copies.
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

  // The output (as last copied by a step with capture on) and each weight
  // gradient (layer-major: grads[layer * 5 + w]), copied to the host after
  // waiting for the device.
  struct StepBytes {
    std::vector<uint8_t> output;
    std::vector<std::vector<uint8_t>> grads;
  };
  StepBytes ReadResults();

  // Zeroes the host copy of the output and every weight gradient (after the
  // compute stream's earlier work), so that a later check cannot pass on the
  // bytes of an earlier step. Waits for it on the host.
  void ClearResults();

  // Writes new values into the static input buffer that FillInput copies
  // from: bf16 uniform in [-1.7, 1.7] from `seed` (the constructor's input is
  // kInputSeed). Ordered after the compute stream's earlier work (a step or
  // a graph launch still reading it), and waited for on the host. Not during
  // a capture.
  static constexpr uint64_t kInputSeed = 12350;
  void SetInput(uint64_t seed);
  cudaStream_t stream() const { return stream_; }

 private:
  static constexpr size_t kWorkspace = size_t{64} << 20;

  // bf16 values uniform in [-scale, scale], made on the host.
  static std::vector<uint16_t> HostRandom(int64_t n, double scale,
                                          uint64_t seed);
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

// CUDA graph memory of `device` (the physical memory mapped for graphs'
// allocation nodes): the larger of its high-water mark since the last reset
// and what is mapped now (a launch's memory stays mapped for its exec).
// Dies on a CUDA error.
uint64_t GraphMemory(int device);
// Resets that high-water mark. Dies on a CUDA error.
void ResetGraphMemoryHigh(int device);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_GPU_EXEC_H_
