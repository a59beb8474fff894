// The backend conformance suites (testing/backend_conformance.h), graph
// capture included, on the simulator: with default options, and with small
// capacities and duration jitter (so that leaked memory runs out and timing
// varies). After every test the simulator must have found no hazard.

#include <memory>

#include "backends/sim/sim_backend.h"
#include "gtest/gtest.h"
#include "testing/backend_conformance.h"

namespace offload {
namespace {

Status NoHazards(Backend& backend) {
  auto* sim = dynamic_cast<SimBackend*>(&backend);
  if (sim == nullptr) return InternalError("not a SimBackend");
  if (sim->hazards().empty()) return OkStatus();
  std::string all;
  for (const Hazard& hazard : sim->hazards()) all += "\n  " + hazard.ToString();
  return InternalError("hazards:" + all);
}

std::unique_ptr<Backend> Small() {
  SimOptions options;
  options.seed = 42;
  options.device_capacity_bytes = int64_t{64} << 20;
  options.pinned_capacity_bytes = int64_t{64} << 20;
  options.duration_jitter = 0.3;
  return NewSimBackend(options);
}

std::unique_ptr<Backend> Default() { return NewSimBackend(SimOptions{}); }

INSTANTIATE_TEST_SUITE_P(
    Sim, BackendConformanceTest,
    ::testing::Values(BackendFactory{"default", Default, NoHazards},
                      BackendFactory{"small_capacity_jitter", Small,
                                     NoHazards}),
    BackendFactoryName());

// Graph capture: replays must be free of hazards too.
INSTANTIATE_TEST_SUITE_P(
    Sim, GraphConformanceTest,
    ::testing::Values(BackendFactory{"default", Default, NoHazards},
                      BackendFactory{"small_capacity_jitter", Small,
                                     NoHazards}),
    BackendFactoryName());

}  // namespace
}  // namespace offload
