// What layer_stack_bench prints to stdout: Markdown tables and summary lines
// (docs/benchmarks.md quotes them).

#ifndef OFFLOAD_BENCH_REPORT_H_
#define OFFLOAD_BENCH_REPORT_H_

#include <vector>

#include "bench/flags.h"
#include "bench/graph_sweep.h"
#include "bench/layer_stack.h"
#include "bench/offload_sweep.h"
#include "bench/pinned_bandwidth.h"

namespace offload::bench {

// The three "#" lines: device, shape, saved bytes per layer, step counts,
// and where the forward pushes (--push_at).
void PrintHeader(const char* device_name, const Flags& flags);

// The pinned copy peak table and the peak the bound uses.
void PrintPinnedPeak(const PinnedPeak& peak);

// The per-GEMM table, the table per k, the bound with each k's own GEMM
// times, the copy, slab and hazard lines and the bit-identity verdict.
// Returns whether every k was bit-identical to k = 0.
// REQUIRES: `sweep.rows` is not empty.
bool PrintSweep(const Shape& s, const SweepResult& sweep, double peak_d2h);

// The CUDA graph table (--graph_k, graph_sweep.h): per k, the eager and the
// launched step's time, host time per step and per offloaded tensor, memory
// and bytes, with what each column is. Returns whether every row's bytes
// equal its eager step's. Prints nothing for no rows.
bool PrintGraphRows(const Flags& flags, const std::vector<GraphRow>& rows);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_REPORT_H_
