// Command-line flags of layer_stack_bench (usage in layer_stack_bench.cc).

#ifndef OFFLOAD_BENCH_FLAGS_H_
#define OFFLOAD_BENCH_FLAGS_H_

#include <vector>

#include "bench/layer_stack.h"

namespace offload::bench {

struct Flags {
  Shape shape;
  int steps = 5;
  int warmup = 2;
  int kmax = -1;  // default: layers - 2
  // Only the simulator, with made-up GEMM durations (checks the driver
  // without a GPU).
  bool sim_only = false;
  std::vector<double> gemm_ms;  // --gemm_ms=a,b,... (15 values), sim only
  int trace_k = -1;             // --trace_k=K: print the simulator's trace
  // --retain: OffloadOptions::retain_pinned_buffers (TE's
  // retain_pinned_cpu_buffers): pinned buffers kept across steps.
  bool retain = false;
};

// Parses --name=value flags; dies on an unknown one. Fills in kmax's default.
Flags ParseFlags(int argc, char** argv);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_FLAGS_H_
