// Command-line flags of layer_stack_bench (usage in layer_stack_bench.cc).

#ifndef OFFLOAD_BENCH_FLAGS_H_
#define OFFLOAD_BENCH_FLAGS_H_

#include <string>
#include <vector>

#include "bench/layer_stack.h"

namespace offload::bench {

struct Flags {
  Shape shape;  // --push_at=gemm|layer sets shape.push_at (layer_stack.h)
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
  // --timeline_k=K: after k = 0's and k = K's timed steps, one more step
  // with every GEMM and engine copy timed, drawn as
  // <timeline_prefix>.json (Chrome trace) and <timeline_prefix>.svg
  // (gpu_timeline.h). -1: none.
  int timeline_k = -1;
  std::string timeline_prefix = "layer_stack_timeline";
  // --budget_k=4,4.5,5: after the k rows, one row per value with the byte
  // budget schedule (OffloadOptions::activation_budget_bytes, SPEC §4.7)
  // given the saved bytes of layers - value layers: what TE's k-of-n keeps
  // resident at k = value (SavedBytesPerLayer in layer_stack.h).
  std::vector<double> budget_k;
  // --joint_k=...: rows with the same budgets planned jointly (SPEC §4.8:
  // OffloadOptions::recompute, the layer costs from k = 0's GEMM times and
  // the pinned peak). --ckpt_k=...: rows that only recompute (no
  // offloading; the layers PlanJoint picks with allow_offload = false for
  // that budget).
  std::vector<double> joint_k;
  std::vector<double> ckpt_k;
  // --probe: byte-budget and joint rows give the Offloader a probe of the
  // device bytes in use (OffloadOptions::device_bytes_probe, SPEC §4.7):
  // CudaBackend::InUseProbe on the GPU, SimBackend::InUseProbe in the
  // simulator. The budget then bounds the step's activation peak as the
  // backend counts it (the last layer's output included), not only the
  // saved tensors. A budget no plan keeps then (the outside bytes count
  // too) is planned at the smallest that fits
  // (OffloadOptions::smallest_budget) instead of ending the run: the row's
  // peak is then above its budget.
  bool probe = false;
  // --graph_k=0,2,4: after the other rows, one row per value with the step
  // captured once as a CUDA graph (CaptureStep, layer_stack.h) and launched
  // `steps` times, next to eager steps of the same k measured the same way
  // (graph_sweep.h). Ignored with --sim_only.
  std::vector<int> graph_k;
  // pipeline_bench only: --pp=P --microbatches=M run pipeline rank 0's 1F1B
  // schedule of M microbatches over P ranks (pipeline_step.h) per step.
  int pp = 1;
  int microbatches = 1;
};

// Parses --name=value flags (tools/flag_parser.h). --help prints the usage
// and exits 0; a mistake prints a message naming the flag, the value and the
// reason, and exits 2. Fills in kmax's default.
Flags ParseFlags(int argc, char** argv);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_FLAGS_H_
