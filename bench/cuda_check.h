// Dies on a failed CUDA runtime call (the benchmark has no recovery path).

#ifndef OFFLOAD_BENCH_CUDA_CHECK_H_
#define OFFLOAD_BENCH_CUDA_CHECK_H_

#include <cuda_runtime.h>

namespace offload::bench {

// Dies with "<what>: <error name>: <error string>" unless `e` is cudaSuccess.
void Cuda(cudaError_t e, const char* what);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_CUDA_CHECK_H_
