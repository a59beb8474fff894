// The limit for a memory budget (issue 11, item 2; docs/limit.md): a lower
// bound on the step time of ANY offloading schedule that keeps the resident
// activation bytes within a budget, given the kernels' measured durations,
// the tensors' timeline and the pinned copy bandwidths.
//
// It is the optimum of a linear program (solved with GLPK) that every real
// schedule satisfies — a relaxation:
//  - The kernels run in their fixed order on one stream, each taking its
//    measured duration; the schedule may insert a stall s_k >= 0 before
//    kernel k (waiting for copies). Step = sum of durations + sum of stalls.
//  - Time is cut into 2K slots: the stall before kernel k, then kernel k.
//  - Copies are fluid: per tensor and slot, an amount of D2H and of H2D
//    bytes. A tensor's D2H runs only after its ready kernel ends, its H2D
//    only re-copies bytes already copied out (cumulatively), and every byte
//    off the device is back by the start of the tensor's first backward
//    reader. Per slot the copied bytes fit the bandwidth x the slot's length,
//    with the two directions sharing the link as measured (duplex region).
//  - At each kernel start, the resident bytes of the live tensors (from
//    their producer's start to their last reader's start, the ones it
//    produces included) are at most the budget. A tensor is whole on the
//    device at its producer and forward readers; between its last forward
//    reader and first backward reader, the bytes off the device are at most
//    the bytes copied out minus those copied back.
// Ignored (each can only make a real schedule slower): copy latency,
// interference of copies with kernels, allocator rounding and
// fragmentation, whole-tensor (non-fluid) copies and frees.
//
// Units: milliseconds and bytes; bandwidths in GB/s (1e9 B/s).

#ifndef OFFLOAD_BENCH_LIMIT_H_
#define OFFLOAD_BENCH_LIMIT_H_

#include <cstdint>
#include <vector>

#include "engine/status.h"

namespace offload::bench {

// One activation. Kernel indices are into LimitProblem::kernel_ms.
struct LimitTensor {
  int64_t bytes = 0;
  // The kernel that allocates and writes it; -1: it exists before kernel 0.
  int producer = -1;
  // Its D2H may start once this kernel has ended (-1: from the start).
  // REQUIRES: >= producer.
  int ready = -1;
  // The last kernel (from the producer on) that needs it whole before it may
  // leave the device (the producer when no forward kernel reads it).
  int free_after = -1;
  // The first kernel that needs it back whole; -1: it is never offloaded
  // (it stays whole until last_use). REQUIRES: > free_after when >= 0.
  int needed_at = -1;
  // Freed after this kernel ends. REQUIRES: >= max(producer, needed_at).
  int last_use = -1;
};

// Pinned copy bandwidths, GB/s. `both_*` is each direction's rate while the
// other direction copies too; 0 means the same as alone (no contention).
struct LimitBandwidth {
  double d2h = 0, h2d = 0;
  double both_d2h = 0, both_h2d = 0;
};

struct LimitProblem {
  std::vector<double> kernel_ms;  // in stream order
  std::vector<LimitTensor> tensors;
  LimitBandwidth bandwidth;
  int64_t budget_bytes = 0;  // resident activation bytes at kernel starts
};

struct LimitResult {
  // False when no schedule fits the budget (it is below the bytes that must
  // be resident at some kernel start); then step_ms is 0.
  bool feasible = false;
  double step_ms = 0;     // the limit: kernels + stalls
  double kernels_ms = 0;  // sum of kernel_ms
  std::vector<double> stall_ms;  // per kernel, in the optimum found
};

// Builds and solves the linear program.
// Errors: kInvalidArgument for an inconsistent problem (indices out of
//   range or out of order, negative sizes or durations, a non-positive
//   bandwidth with a tensor to offload); kInternal if GLPK fails.
StatusOr<LimitResult> ComputeLimit(const LimitProblem& problem);

// The fewest bytes resident at some kernel start in any schedule: the
// tensors that cannot leave the device there. Budgets below it are
// infeasible.
int64_t MinimumResidentBytes(const LimitProblem& problem);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_LIMIT_H_
