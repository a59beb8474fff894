#include "bench/cuda_check.h"

#include <string>

#include "bench/bench_util.h"

namespace offload::bench {

void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    Die(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
        cudaGetErrorString(e));
  }
}

}  // namespace offload::bench
