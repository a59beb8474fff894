// The timing loop of layer_stack_bench: for k = 0 .. kmax offloaded layers,
// runs the stack on the GPU and measures the step time, the activations'
// peak, the host cost of the Offloader calls and the engine's copies, checks
// the outputs against k = 0, and computes the simulator's bound for that k.

#ifndef OFFLOAD_BENCH_OFFLOAD_SWEEP_H_
#define OFFLOAD_BENCH_OFFLOAD_SWEEP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/flags.h"
#include "bench/gpu_exec.h"
#include "bench/layer_stack.h"
#include "timeline/timeline.h"

namespace offload::bench {

// The figures for one k, or one byte budget.
struct SweepRow {
  int k = 0;               // -1 for a byte-budget, joint or ckpt row
  RowMode mode = RowMode::kLayers;
  bool probe = false;  // --probe: the Offloader had CudaBackend::InUseProbe
  int recomputed = 0;      // layers recomputed per step
  double budget_k = -1;    // --budget_k value of a byte-budget row
  int64_t budget_bytes = 0;
  double step_ns = 0, host_ns_per_offloaded = 0, host_ns_per_push = 0;
  uint64_t peak = 0;  // the device pool's UsedMemHigh over the timed steps
  double d2h_gbps = 0, h2d_gbps = 0, d2h_bytes = 0, h2d_bytes = 0;
  size_t copies = 0;    // engine copies in the copy-timed step
  size_t min_copy = 0;  // bytes of the smallest of them
  double bound_ns = 0;  // simulated step with k = 0's GEMM times
  // A joint row: the plan's predicted step and its limit (JointRowLimitOf),
  // 0 where there is none.
  double plan_ns = 0, limit_ns = 0;
  int64_t sim_peak = 0;
  size_t hazards = 0;
  bool identical = false;  // outputs and weight gradients equal k = 0's
  int64_t pinned_slab_allocs = 0;
  // Simulated step with this k's own GEMM times, and those times summed.
  double bound_own_ns = 0, fwd_ns = 0, bwd_ns = 0;
  double call_us[kCalls] = {};  // mean host time per Offloader call
};

struct SweepResult {
  std::vector<SweepRow> rows;  // k = 0 .. kmax, then one per --budget_k
  std::array<double, kGemms> gemm_ns{};  // per-GEMM medians at k = 0
  // With --timeline_k=K: one extra step each at k = 0 and k = K, timed
  // GEMM by GEMM and copy by copy (gpu_timeline.h).
  std::vector<timeline::Timeline> timelines;
};

// Runs the sweep. `peak_d2h` and `peak_h2d` (GB/s) are the copy speeds the
// bound assumes. Prints progress and the engine's warnings to stderr.
// REQUIRES: GlobalCopyTimer() has its compute stream and its event pool.
SweepResult RunSweep(GpuExec& ex, CudaBackend& be, const Flags& flags,
                     double peak_d2h, double peak_h2d);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_OFFLOAD_SWEEP_H_
