// layer_stack_bench's Markdown output (report.h) read back, for the limit
// tool: the shape, the pinned copy peaks, the per-GEMM times, the row of
// each k of the sweep and of each byte budget.

#ifndef OFFLOAD_BENCH_BENCH_OUTPUT_H_
#define OFFLOAD_BENCH_BENCH_OUTPUT_H_

#include <array>
#include <string>
#include <vector>

#include "bench/layer_stack.h"
#include "bench/limit.h"
#include "engine/status.h"

namespace offload::bench {

// One row of "Offloading k of n layers".
struct BenchRow {
  int k = 0;
  double step_ms = 0;
  double peak_gib = 0;   // act. peak GiB (the device pool's high mark)
  double bound_ms = 0;   // the engine's own schedule on the simulator
  double budget_k = -1;  // a byte-budget row's --budget_k
  // The row's own GEMM times per layer, summed over forward and backward
  // (calibrated in that configuration); 0 if not printed.
  double own_layer_ms = 0;
};

struct BenchOutput {
  Shape shape;
  std::array<double, kGemms> gemm_ms{};
  // The largest figure of each column of the pinned peak table (all chunk
  // sizes): a lower bound must not assume a slower link than was measured.
  LimitBandwidth bandwidth;
  std::vector<BenchRow> rows;  // k = 0, 1, ...
  // "Byte budget" rows (--budget_k), if any: k is -1, budget_k the value.
  std::vector<BenchRow> budget_rows;
};

// Parses the text of one output (e.g. bench/results/.../h4096.md).
// Errors: kInvalidArgument naming the first missing piece (the header
//   line, a GEMM's time, the pinned table, the k = 0 row).
StatusOr<BenchOutput> ParseBenchOutput(const std::string& text);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_BENCH_OUTPUT_H_
