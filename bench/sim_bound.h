// The "bound" column of layer_stack_bench: the engine's own schedule (the
// same Offloader calls, the same GEMM order) on the SimBackend, with each
// GEMM taking its measured duration and copies running at the measured
// pinned peak with no latency. It is what this schedule allows, not a lower
// bound on other schedules (TE ran below it); the limit for a memory budget
// is limit.h (docs/limit.md).

#ifndef OFFLOAD_BENCH_SIM_BOUND_H_
#define OFFLOAD_BENCH_SIM_BOUND_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backends/sim/sim_backend.h"
#include "bench/layer_stack.h"

namespace offload::bench {

struct SimResult {
  double step_ns = 0;      // the last of three simulated steps
  int64_t peak_bytes = 0;  // simulated device memory peak of the last step
  size_t hazards = 0;      // data races the simulator saw
  int64_t bytes_offloaded = 0;  // D2H bytes of the last step
};

// Simulates three steps of `s` with `k` layers offloaded. `ns[g]` is GEMM g's
// duration; the bandwidths are in GB/s (1e9 B/s). With `print_trace`, prints
// the simulator's start/end lines of the compute and copy streams to stdout.
SimResult SimulateSchedule(const Shape& s, int k,
                           const std::array<double, kGemms>& ns,
                           double d2h_gbps, double h2d_gbps,
                           bool print_trace = false);

// The same with any Offloader options (e.g. a byte budget: the first of the
// three steps records, the last is planned). The options' own
// device_bytes_probe (another backend's) is ignored; with `probe` the
// simulator's (SimBackend::InUseProbe) takes its place (SPEC §4.7).
SimResult SimulateSchedule(const Shape& s, const OffloadOptions& options,
                           const std::array<double, kGemms>& ns,
                           double d2h_gbps, double h2d_gbps,
                           bool print_trace = false, bool probe = false);

// The layer stack's GEMMs on `sim`: kernel g takes ns[g] nanoseconds and
// declares the activations it reads and writes (for the hazard detector);
// no weights, gradients or bytes. REQUIRES: `sim` outlives the Exec.
std::unique_ptr<Exec> NewSimExec(SimBackend& sim,
                                 const std::array<double, kGemms>& ns);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_SIM_BOUND_H_
