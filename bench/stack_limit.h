// The memory-budget limit (limit.h) of the layer stack: its recorded tensor
// timeline (layer_stack_timeline.h) with per-GEMM durations as a
// LimitProblem.

#ifndef OFFLOAD_BENCH_STACK_LIMIT_H_
#define OFFLOAD_BENCH_STACK_LIMIT_H_

#include <array>
#include <cstdint>

#include "bench/layer_stack.h"
#include "bench/layer_stack_timeline.h"
#include "bench/limit.h"

namespace offload::bench {

// What the budget counts.
enum class BudgetCounts {
  // Every activation of the timeline: the memory a schedule really holds
  // (the bench's "act. peak" counts the same).
  kAllActivations,
  // Only the saved tensors: what the engine's byte budget counts (SPEC
  // §4.7; it never sees tensors that are not pushed, here the last
  // layer's output). Unsaved tensors are given 0 bytes.
  kSavedOnly,
};

// Kernel k takes gemm_ms[kernel's GEMM id]. Every activation is a tensor
// of the problem: a saved one may leave the device between its last forward
// reader and its first backward reader, once its push made it ready; the
// others (the last layer's output) stay until their last use.
LimitProblem StackLimitProblem(const StackTimeline& t,
                               const std::array<double, kGemms>& gemm_ms,
                               const LimitBandwidth& bandwidth,
                               int64_t budget_bytes,
                               BudgetCounts counts = BudgetCounts::kAllActivations);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_STACK_LIMIT_H_
