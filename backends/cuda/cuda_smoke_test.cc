// The GPU machine works as the notes say: a device is visible, pinned memory
// round-trips through device memory on two streams, and the copy engines are
// there for both directions at once.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace {

#define ASSERT_CUDA(expr)                                             \
  do {                                                                \
    cudaError_t cuda_status_ = (expr);                                \
    ASSERT_EQ(cuda_status_, cudaSuccess)                              \
        << #expr << ": " << cudaGetErrorString(cuda_status_);         \
  } while (false)

TEST(CudaSmokeTest, DeviceHasTwoCopyEnginesAndRoundTripsPinnedBytes) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  ASSERT_GE(count, 1);
  cudaDeviceProp props{};
  ASSERT_CUDA(cudaGetDeviceProperties(&props, 0));
  EXPECT_GE(props.asyncEngineCount, 2) << props.name;

  constexpr size_t kBytes = size_t{16} << 20;
  uint8_t* host_in = nullptr;
  uint8_t* host_out = nullptr;
  void* device = nullptr;
  ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host_in), kBytes,
                            cudaHostAllocDefault));
  ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host_out), kBytes,
                            cudaHostAllocDefault));
  ASSERT_CUDA(cudaMalloc(&device, kBytes));
  for (size_t i = 0; i < kBytes; ++i) host_in[i] = static_cast<uint8_t>(i * 13);

  cudaStream_t h2d, d2h;
  cudaEvent_t written;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  ASSERT_CUDA(cudaMemcpyAsync(device, host_in, kBytes, cudaMemcpyDefault, h2d));
  ASSERT_CUDA(cudaEventRecord(written, h2d));
  ASSERT_CUDA(cudaStreamWaitEvent(d2h, written, 0));
  ASSERT_CUDA(cudaMemcpyAsync(host_out, device, kBytes, cudaMemcpyDefault, d2h));
  ASSERT_CUDA(cudaStreamSynchronize(d2h));
  size_t mismatches = 0;
  for (size_t i = 0; i < kBytes; ++i) mismatches += host_in[i] != host_out[i];
  EXPECT_EQ(mismatches, 0u);

  ASSERT_CUDA(cudaEventDestroy(written));
  ASSERT_CUDA(cudaStreamDestroy(h2d));
  ASSERT_CUDA(cudaStreamDestroy(d2h));
  ASSERT_CUDA(cudaFree(device));
  ASSERT_CUDA(cudaFreeHost(host_in));
  ASSERT_CUDA(cudaFreeHost(host_out));
}

}  // namespace
