// The backend conformance suite (testing/backend_conformance.h) on the GPU:
// with default options, and with tiny pinned slabs and a pinned capacity, so
// that pieces are split and merged across many slabs, large requests get
// slabs of their own, and the pool runs into its capacity. After every test
// nothing may be left allocated, and no ~Buffer release may have failed.

#include <memory>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "testing/backend_conformance.h"

namespace offload {
namespace {

std::unique_ptr<Backend> Make(const CudaOptions& options) {
  StatusOr<std::unique_ptr<CudaBackend>> backend = NewCudaBackend(options);
  if (!backend.ok()) {
    ADD_FAILURE() << backend.status();
    return nullptr;
  }
  return std::move(backend).value();
}

CudaOptions TinySlabs() {
  CudaOptions options;
  options.pinned_slab_bytes = 64 << 10;
  options.pinned_capacity_bytes = int64_t{128} << 20;
  return options;
}

// Everything the test allocated was returned: no device memory in use, and
// after a Trim no pinned slab left (a slab with a piece in use would stay).
Status NothingLeaked(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return InternalError("not a CudaBackend");
  OFFLOAD_RETURN_IF_ERROR(cuda->Trim());
  OFFLOAD_ASSIGN_OR_RETURN(CudaBackendStats stats, cuda->stats());
  if (stats.device_bytes_in_use != 0 || stats.pinned_bytes_in_use != 0 ||
      stats.pinned_slab_bytes != 0 || stats.pinned_pending_frees != 0 ||
      stats.release_failures != 0) {
    return InternalError(
        "left over: " + std::to_string(stats.device_bytes_in_use) +
        " device bytes, " + std::to_string(stats.pinned_bytes_in_use) +
        " pinned bytes in use, " + std::to_string(stats.pinned_slab_bytes) +
        " bytes in pinned slabs, " +
        std::to_string(stats.pinned_pending_frees) + " pending frees, " +
        std::to_string(stats.release_failures) + " failed releases");
  }
  return OkStatus();
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, BackendConformanceTest,
    ::testing::Values(
        BackendFactory{"default", [] { return Make(CudaOptions{}); },
                       NothingLeaked},
        BackendFactory{"tiny_pinned_slabs", [] { return Make(TinySlabs()); },
                       NothingLeaked}),
    BackendFactoryName());

// Graph capture (engine/backend.h): the suite the simulator runs too.
INSTANTIATE_TEST_SUITE_P(
    Cuda, GraphConformanceTest,
    ::testing::Values(
        BackendFactory{"default", [] { return Make(CudaOptions{}); },
                       NothingLeaked},
        BackendFactory{"tiny_pinned_slabs", [] { return Make(TinySlabs()); },
                       NothingLeaked}),
    BackendFactoryName());

}  // namespace
}  // namespace offload
