// The CUDA graph rows of layer_stack_bench (--graph_k, SPEC §5.7): for each
// k, eager steps through an Offloader, then the same step captured once as a
// CUDA graph (CaptureStep, layer_stack.h) and launched, both timed the same
// way in the same process: step time, host time per step, memory, bytes.
//
// Per k:
//  1. Eager: a fresh Offloader; `warmup` steps; `steps` timed steps; one more
//     step with the output copied to the host, hashed with the gradients.
//  2. Graph (timed): the backend trimmed (earlier graphs' and the eager
//     pool's idle memory given back); a fresh Offloader; CaptureStep with one
//     warm-up iteration; Instantiate; `warmup` untimed launches (the first
//     maps the graph's memory), then `steps` timed launches. The captured
//     step has no output copy, like the eager timed steps; its weight
//     gradients (zeroed before its launches) are hashed afterwards.
//  3. Graph (check): a fresh Offloader, the step captured with the output
//     copy, launched once after zeroing the output's host copy and the
//     gradients: every hash must equal the eager step's.
// A timed step starts at a cudaDeviceSynchronize and ends at the next one;
// two timing events on the compute stream bracket its work.

#ifndef OFFLOAD_BENCH_GRAPH_SWEEP_H_
#define OFFLOAD_BENCH_GRAPH_SWEEP_H_

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/flags.h"
#include "bench/gpu_exec.h"

namespace offload::bench {

struct GraphRow {
  int k = 0;
  double offloaded_tensors = 0;  // per eager step (Offloader stats)
  int64_t nodes = 0;             // of the timed graph (Graph::size)
  // Medians over the timed steps.
  double eager_wall_ns = 0, graph_wall_ns = 0;  // host clock, sync to sync
  double eager_gpu_ns = 0, graph_gpu_ns = 0;    // the events around the work
  // Host side of a step, from its start (after the sync) to the return of
  // the last call that enqueues it (the start event's record included):
  // eager, RunStep (Offloader calls, device allocations and frees, GEMM
  // launches); graph, Backend::Launch and nothing else.
  double eager_host_ns = 0, graph_host_ns = 0;
  double eager_engine_ns = 0;  // eager: inside Offloader calls
  double launch_ns = 0;        // graph: the Backend::Launch call alone
  double capture_ns = 0;       // once: BeginCapture .. EndCapture
  double instantiate_ns = 0;   // once: Backend::Instantiate
  uint64_t eager_peak = 0;     // device pool UsedMemHigh, eager timed steps
  uint64_t graph_memory = 0;   // graph memory (cudaGraphMemAttrUsedMem*)
  bool grads_identical = false;  // timed graph's gradients == eager step's
  bool identical = false;        // check graph's output and gradients
};

// Runs the rows of flags.graph_k. Prints progress and engine warnings to
// stderr. Dies on any CUDA or engine error.
std::vector<GraphRow> RunGraphRows(GpuExec& ex, CudaBackend& be,
                                   const Flags& flags);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_GRAPH_SWEEP_H_
