// GPU benchmark of the offload engine on a transformer-block-like layer stack
// with real bf16 GEMMs (cuBLAS), next to the engine's own schedule on the
// SimBackend with the measured kernel durations and pinned copy bandwidth
// (the "bound" column). The limit for a memory budget is computed from this
// output by //bench:limit_tool (docs/limit.md). See docs/benchmarks.md.
//
//   layer_stack_bench --hidden=4096 --tokens=8192 [--layers=8] [--steps=5]
//                     [--warmup=2] [--kmax=6] [--retain]
//                     [--push_at=gemm|layer]
//                     [--sim_only [--gemm_ms=a,b,...] [--trace_k=K]]
//                     [--timeline_k=K --timeline_prefix=PATH]
//                     [--budget_k=4,4.5,...]  (byte-budget rows, SPEC §4.7)
//                     [--probe]  (budget and joint rows: a probe of device
//                                 bytes in use, SPEC §4.7)
//                     [--graph_k=0,2,4]  (the step as a CUDA graph, §5.7)
//
// The pieces, in bench/:
//   flags.h             the command line
//   layer_stack.h       the layers, their GEMMs and one training step
//   gpu_exec.h          that step on the GPU (cuBLAS)
//   pinned_bandwidth.h  the raw pinned copy peak
//   sim_bound.h         the engine's schedule on the simulator ("bound")
//   offload_sweep.h     the timing loop over k offloaded layers
//   graph_sweep.h       the step captured as a CUDA graph (--graph_k)
//   copy_interposer.h   timing of the engine's copies (-Wl,--wrap)
//   call_counter.h      CUDA runtime calls per offloaded tensor (-Wl,--wrap)
//   gpu_timeline.h      one step as a timeline picture (--timeline_k)
//   report.h            the tables printed to stdout

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <memory>

#include "backends/cuda/cuda_backend.h"
#include "bench/bench_util.h"
#include "bench/call_counter.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "bench/flags.h"
#include "bench/gpu_exec.h"
#include "bench/gpu_timeline.h"
#include "bench/graph_sweep.h"
#include "bench/layer_stack.h"
#include "bench/offload_sweep.h"
#include "bench/pinned_bandwidth.h"
#include "bench/report.h"
#include "bench/sim_bound.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_of.h"

namespace offload::bench {
namespace {

// --sim_only: the bound alone, with --gemm_ms durations (1 ms by default).
void RunSimOnly(const Flags& flags) {
  const Shape& s = flags.shape;
  std::array<double, kGemms> ns;
  for (int g = 0; g < kGemms; ++g) {
    ns[g] = g < int(flags.gemm_ms.size()) ? flags.gemm_ms[g] * 1e6 : 1e6;
  }
  std::printf("# sim only: layers %d, hidden %lld, tokens %lld, "
              "--push_at=%s\n",
              s.layers, (long long)s.hidden, (long long)s.tokens,
              PushAtName(s.push_at));
  for (int k = 0; k <= flags.kmax; ++k) {
    SimResult r = SimulateSchedule(s, k, ns, 55.3, 55.4, k == flags.trace_k);
    std::printf("sim k=%d: step %.3f ms, peak %.3f GiB, hazards %zu\n", k,
                r.step_ns / 1e6, GiB(r.peak_bytes), r.hazards);
  }
  // The peak is the simulator's device high-water mark of the step (all
  // it allocates: the user's measure); --probe gives the budget rows the
  // simulator's probe of it.
  for (double b : flags.budget_k) {
    OffloadOptions oo = BenchOptions(s, 0, b, false);
    oo.smallest_budget = flags.probe;  // see Flags::probe
    SimResult r = SimulateSchedule(s, oo, ns, 55.3, 55.4, false, flags.probe);
    std::printf("sim budget k=%g (%.3f GiB)%s: step %.3f ms, peak %.3f GiB "
                "(%+.3f GiB of the budget), offloaded %.3f GiB/step, hazards "
                "%zu\n",
                b, GiB(BudgetForK(s, b)), flags.probe ? " probe" : "",
                r.step_ns / 1e6, GiB(r.peak_bytes),
                GiB(r.peak_bytes - BudgetForK(s, b)), GiB(r.bytes_offloaded),
                r.hazards);
  }
  // The joint plan (SPEC §4.8) and recompute alone, at the same budgets,
  // with the bandwidths the simulator copies at.
  for (RowMode mode : {RowMode::kJoint, RowMode::kCheckpoint}) {
    for (double b : mode == RowMode::kJoint ? flags.joint_k : flags.ckpt_k) {
      Shape rs = s;
      OffloadOptions oo;
      std::string plan_text;
      if (!RowOptions(rs, mode, b, ns, 55.3, 55.4, false, &oo, &plan_text)) {
        continue;
      }
      int recomputed = RecomputedLayers(rs, static_cast<const JointPlan*>(nullptr));
      if (mode == RowMode::kJoint) {  // the plan the Offloader will make
        const JointProblem problem = JointProblemOf(oo);
        StatusOr<JointPlan> plan = PlanJoint(problem);
        if (!plan.ok()) {
          std::printf("sim joint k=%g: %s\n", b,
                      plan.status().ToString().c_str());
          continue;
        }
        recomputed = RecomputedLayers(rs, &*plan);
        plan_text = FormatJointPlan(*plan, problem);
        if (StatusOr<JointRowLimit> limit = JointRowLimitOf(oo); limit.ok()) {
          char line[128];
          std::snprintf(line, sizeof(line),
                        "plan %.3f ms, limit %.3f ms: plan/limit %.3f\n",
                        limit->plan_ns / 1e6, limit->limit_ns / 1e6,
                        limit->plan_ns / limit->limit_ns);
          plan_text += line;
        }
      }
      const bool probe = flags.probe && mode == RowMode::kJoint;
      oo.smallest_budget = probe;  // see Flags::probe
      SimResult r = SimulateSchedule(rs, oo, ns, 55.3, 55.4, false, probe);
      std::printf("sim %s k=%g (%.3f GiB)%s: step %.3f ms, peak %.3f GiB "
                  "(%+.3f GiB of the budget), recomputed %d layers, offloaded "
                  "%.3f GiB/step, hazards %zu\n%s",
                  RowModeName(mode), b, GiB(BudgetForK(s, b)),
                  probe ? " probe" : "", r.step_ns / 1e6, GiB(r.peak_bytes),
                  GiB(r.peak_bytes - BudgetForK(s, b)), recomputed,
                  GiB(r.bytes_offloaded), r.hazards, plan_text.c_str());
    }
  }
}

int Main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  const Shape& s = flags.shape;
  if (flags.sim_only) {
    if (!flags.graph_k.empty()) {
      std::fprintf(stderr, "note: --graph_k needs the GPU; ignored with "
                           "--sim_only\n");
    }
    RunSimOnly(flags);
    return 0;
  }
  std::unique_ptr<CudaBackend> be =
      Must(NewCudaBackend(CudaOptions{}), "NewCudaBackend");
  if (SeenMemPool() == nullptr) Die("the backend's device pool was not seen");
  cudaDeviceProp prop{};
  Cuda(cudaGetDeviceProperties(&prop, be->device()), "props");
  PrintHeader(prop.name, flags);

  // Pinned peak, at the sizes the stack copies.
  const size_t span_small = size_t(s.tokens * s.hidden * 2);  // x, attn, o
  const PinnedPeak peak = MeasurePinnedPeak(span_small);
  PrintPinnedPeak(peak);
  const double peak_d2h = peak.d2h();
  const double peak_h2d = peak.h2d();

  GpuExec ex(*be, s);
  CopyTimer& copies = GlobalCopyTimer();
  copies.compute = ex.stream();
  copies.pool.resize(2048);
  for (auto& e : copies.pool) Cuda(cudaEventCreate(&e), "event");

  const SweepResult sweep = RunSweep(ex, *be, flags, peak_d2h, peak_h2d);
  bool ok = PrintSweep(s, sweep, peak_d2h);
  PrintCallCounts(MeasureCallCounts(ex, *be, flags));
  if (flags.timeline_k > flags.kmax) {
    std::fprintf(stderr, "warning: --timeline_k=%d > kmax=%d: no timeline\n",
                 flags.timeline_k, flags.kmax);
  } else if (!sweep.timelines.empty()) {
    PrintTimelineSummary(sweep.timelines);
    ok = WriteTimelines(sweep.timelines, flags.timeline_prefix) && ok;
  }
  if (!flags.graph_k.empty()) {
    ok = PrintGraphRows(flags, RunGraphRows(ex, *be, flags)) && ok;
  }
  for (auto& e : copies.pool) cudaEventDestroy(e);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace offload::bench

int main(int argc, char** argv) { return offload::bench::Main(argc, argv); }
