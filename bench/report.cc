#include "bench/report.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace offload::bench {
namespace {

// Bytes each layer saves: x, qkv, attn, o and u, bf16 ([T,H] x 10 in all).
int64_t ActivationBytesPerLayer(const Shape& s) {
  return s.tokens * s.hidden * 2 * 10;
}

// "k=3" or "budget k=4.5".
std::string Label(const SweepRow& r) {
  char text[48];
  if (r.k >= 0) {
    std::snprintf(text, sizeof(text), "k=%d", r.k);
  } else {
    std::snprintf(text, sizeof(text), "%s k=%g", RowModeName(r.mode),
                  r.budget_k);
  }
  return text;
}

// The byte-budget rows next to TE's k-of-n rows of the same run at the
// integer k around each budget.
void PrintBudgetRows(const Shape& s, const std::vector<SweepRow>& rows) {
  const SweepRow& r0 = rows[0];
  auto k_row = [&](int k) -> const SweepRow* {
    for (const SweepRow& r : rows) {
      if (r.k == k) return &r;
    }
    return nullptr;
  };
  bool any = false;
  for (const SweepRow& r : rows) any = any || r.mode == RowMode::kBudget;
  if (!any) return;
  std::printf("\n## Byte budget (SPEC §4.7) against k of %d layers\n\n"
              "Budget = the saved bytes of layers - k layers (what k-of-n keeps "
              "resident by SPEC §4.1). TE k-of-n columns: this run's rows at "
              "floor(k) / ceil(k).\n\n", s.layers);
  std::printf("| budget k | budget GiB | step ms | ratio | act. peak GiB | "
              "ratio | k-of-n ratio (floor/ceil) | k-of-n peak ratio | "
              "bound ms | measured/bound | offloaded GiB/step | "
              "host us/offl. tensor | bit-identical | fwd ms/layer (own) | "
              "bwd ms/layer (own) | peak - budget GiB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|\n");
  for (const SweepRow& r : rows) {
    if (r.mode != RowMode::kBudget) continue;
    const SweepRow* lo = k_row(int(r.budget_k));
    const SweepRow* hi = k_row(int(r.budget_k + 0.999));
    char te[64] = "-", te_peak[64] = "-";
    if (lo != nullptr && hi != nullptr) {
      std::snprintf(te, sizeof(te), "x%.3f / x%.3f", lo->step_ns / r0.step_ns,
                    hi->step_ns / r0.step_ns);
      std::snprintf(te_peak, sizeof(te_peak), "x%.2f / x%.2f",
                    double(lo->peak) / double(r0.peak),
                    double(hi->peak) / double(r0.peak));
    }
    std::printf("| %g | %.2f | %.2f | x%.3f | %.2f | x%.2f | %s | %s | %.2f | "
                "%.3f | %.2f | %.2f | %s | %.3f | %.3f | %+.3f%s |\n",
                r.budget_k, GiB(r.budget_bytes), r.step_ns / 1e6,
                r.step_ns / r0.step_ns, GiB(r.peak),
                double(r.peak) / double(r0.peak), te, te_peak,
                r.bound_ns / 1e6, r.step_ns / r.bound_ns, GiB(r.d2h_bytes),
                r.host_ns_per_offloaded / 1e3, r.identical ? "yes" : "NO",
                r.fwd_ns / 1e6, r.bwd_ns / 1e6,
                GiB(int64_t(r.peak) - r.budget_bytes),
                r.probe ? " (probe)" : "");
  }
}

// The joint plan's rows and recompute-only rows (SPEC §4.8) next to the
// byte-budget row of the same budget, when this run has one.
void PrintJointRows(const std::vector<SweepRow>& rows) {
  const SweepRow& r0 = rows[0];
  bool any = false;
  for (const SweepRow& r : rows) {
    any = any || r.mode == RowMode::kJoint || r.mode == RowMode::kCheckpoint;
  }
  if (!any) return;
  auto budget_row = [&](double k) -> const SweepRow* {
    for (const SweepRow& r : rows) {
      if (r.mode == RowMode::kBudget && r.budget_k == k) return &r;
    }
    return nullptr;
  };
  std::printf(
      "\n## Joint plan and recompute only (SPEC §4.8)\n\n"
      "joint: the byte budget of the same k planned with recompute "
      "(OffloadOptions::recompute; layer costs from k=0's GEMM times and the "
      "pinned peak). ckpt: the layers PlanJoint recomputes without "
      "offloading; nothing is offloaded. A recomputed layer saves only x "
      "and re-runs its GEMMs 0..3 before its backward. Peaks are the "
      "device pool's (everything the step allocates). The budget counts "
      "saved tensors and re-created ones, and with --probe (rows marked "
      "probe) everything the pool holds between the forward's first push and "
      "the backward's last call (SPEC §4.7). "
      "plan ms: the joint plan's predicted step; limit ms: the least step any "
      "keep / offload / recompute choice of the same layers can have within "
      "the budget (engine/plan/joint_limit.h), from the same layer costs.\n\n");
  std::printf("| row | budget k | budget GiB | step ms | ratio | act. peak GiB "
              "| ratio | recomputed layers | offloaded GiB/step | byte budget "
              "ratio (same k) | bound ms | measured/bound | plan ms | limit ms "
              "| plan/limit | bit-identical | peak - budget GiB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|\n");
  for (const SweepRow& r : rows) {
    if (r.mode != RowMode::kJoint && r.mode != RowMode::kCheckpoint) continue;
    char budget[32] = "-";
    if (const SweepRow* b = budget_row(r.budget_k)) {
      std::snprintf(budget, sizeof(budget), "x%.3f", b->step_ns / r0.step_ns);
    }
    char limit[64] = "- | - | -";
    if (r.limit_ns > 0) {
      std::snprintf(limit, sizeof(limit), "%.2f | %.2f | %.3f", r.plan_ns / 1e6,
                    r.limit_ns / 1e6, r.plan_ns / r.limit_ns);
    }
    std::printf("| %s | %g | %.2f | %.2f | x%.3f | %.2f | x%.2f | %d | %.2f "
                "| %s | %.2f | %.3f | %s | %s | %+.3f%s |\n",
                RowModeName(r.mode), r.budget_k, GiB(r.budget_bytes),
                r.step_ns / 1e6, r.step_ns / r0.step_ns, GiB(r.peak),
                double(r.peak) / double(r0.peak), r.recomputed,
                GiB(r.d2h_bytes), budget, r.bound_ns / 1e6,
                r.step_ns / r.bound_ns, limit, r.identical ? "yes" : "NO",
                GiB(int64_t(r.peak) - r.budget_bytes),
                r.probe ? " (probe)" : "");
  }
}

}  // namespace

void PrintHeader(const char* device_name, const Flags& flags) {
  const Shape& s = flags.shape;
  std::printf("# layer_stack_bench: %s, layers %d, hidden %lld, tokens %lld, "
              "bf16 GEMMs (cublasGemmEx, compute 32F)\n",
              device_name, s.layers, (long long)s.hidden, (long long)s.tokens);
  std::printf("# saved per layer: x, qkv, attn, o, u = %.1f MiB; step "
              "median of %d after %d warm-up\n",
              ActivationBytesPerLayer(s) / 1048576.0, flags.steps,
              flags.warmup);
  std::printf("# pushes: --push_at=%s (%s)\n\n", PushAtName(s.push_at),
              s.push_at == PushAt::kGemm
                  ? "each saved tensor after the GEMM that produces it"
                  : "all five after the layer's last forward GEMM");
}

void PrintPinnedPeak(const PinnedPeak& peak) {
  std::printf("## Pinned copy peak (raw cudaMemcpyAsync, GB/s)\n\n");
  std::printf("| chunk | D2H alone | H2D alone | D2H (both) | H2D (both) |\n");
  std::printf("|---|---|---|---|---|\n");
  auto bwrow = [](const char* name, const Bandwidth& b) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", name, b.d2h, b.h2d,
                b.both_d2h, b.both_h2d);
  };
  bwrow("16 MiB", peak.mib16);
  char label[64];
  std::snprintf(label, sizeof label, "%.0f MiB", peak.span_small / 1048576.0);
  bwrow(label, peak.small);
  bwrow("256 MiB", peak.big);
  std::printf("\npeak used for the bound: D2H %.1f, H2D %.1f GB/s\n\n",
              peak.d2h(), peak.h2d());
}

bool PrintSweep(const Shape& s, const SweepResult& sweep, double peak_d2h) {
  const std::vector<SweepRow>& rows = sweep.rows;
  const std::array<double, kGemms>& gemm_ns = sweep.gemm_ns;
  std::printf("## Per-GEMM compute time (median of 3 steps x %d layers, "
              "k=0)\n\n| GEMM | ms |\n|---|---|\n", s.layers);
  double fwd = 0, bwd = 0;
  for (int g = 0; g < kGemms; ++g) {
    std::printf("| %s | %.3f |\n", kGemmNames[g], gemm_ns[g] / 1e6);
    (g < 5 ? fwd : bwd) += gemm_ns[g];
  }
  std::printf("\nper layer: forward %.3f ms, backward %.3f ms; one layer's "
              "saved bytes take %.3f ms at the D2H peak\n\n",
              fwd / 1e6, bwd / 1e6,
              ActivationBytesPerLayer(s) / (peak_d2h * 1e6));

  const SweepRow& r0 = rows[0];
  std::printf("## Offloading k of %d layers\n\n", s.layers);
  std::printf("| k | step ms | ratio | act. peak GiB | ratio | D2H GB/s | "
              "H2D GB/s | bound ms | measured/bound | sim peak GiB | "
              "host us/offl. tensor | host us/push | bit-identical |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SweepRow& r : rows) {
    if (r.k < 0) continue;  // byte-budget rows: their own table below
    std::printf("| %d | %.2f | x%.3f | %.2f | x%.2f | %s | %s | %.2f | %.3f | "
                "%.2f | %s | %.2f | %s |\n",
                r.k, r.step_ns / 1e6, r.step_ns / r0.step_ns, GiB(r.peak),
                double(r.peak) / double(r0.peak),
                r.d2h_gbps > 0 ? std::to_string(r.d2h_gbps).substr(0, 5).c_str()
                               : "-",
                r.h2d_gbps > 0 ? std::to_string(r.h2d_gbps).substr(0, 5).c_str()
                               : "-",
                r.bound_ns / 1e6, r.step_ns / r.bound_ns, GiB(r.sim_peak),
                r.k ? std::to_string(r.host_ns_per_offloaded / 1e3)
                          .substr(0, 6)
                          .c_str()
                    : "-",
                r.host_ns_per_push / 1e3, r.identical ? "yes" : "NO");
  }
  std::printf("\n## Bound with each k's own GEMM times, and host cost per "
              "call\n\n| k | fwd ms/layer | bwd ms/layer | bound (own) ms | "
              "measured/bound (own) |");
  for (int q = 0; q < kCalls; ++q) std::printf(" %s us |", kCallNames[q]);
  std::printf("\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SweepRow& r : rows) {
    if (r.k < 0) continue;
    std::printf("| %d | %.3f | %.3f | %.2f | %.3f |", r.k, r.fwd_ns / 1e6,
                r.bwd_ns / 1e6, r.bound_own_ns / 1e6,
                r.step_ns / r.bound_own_ns);
    for (int q = 0; q < kCalls; ++q) std::printf(" %.2f |", r.call_us[q]);
    std::printf("\n");
  }
  std::printf("\nD2H/H2D GB/s: bytes / summed duration of the engine's copies"
              " (timed events around each cudaMemcpyAsync on the copy "
              "streams, one extra step). Copies per step and smallest copy:");
  for (const SweepRow& r : rows) {
    std::printf(" %s: %zu x >= %.0f MiB (%.2f GiB each way);",
                Label(r).c_str(), r.copies, r.min_copy / 1048576.0,
                GiB(r.d2h_bytes));
  }
  std::printf("\npinned slabs allocated during the timed steps:");
  for (const SweepRow& r : rows) {
    std::printf(" %lld", (long long)r.pinned_slab_allocs);
  }
  std::printf("\nsimulator hazards:");
  for (const SweepRow& r : rows) std::printf(" %zu", r.hazards);
  std::printf("\n");
  PrintBudgetRows(s, rows);
  PrintJointRows(rows);
  bool ok = true;
  for (const SweepRow& r : rows) ok = ok && r.identical;
  std::printf("\noutputs and all %d weight gradients bit-identical to k=0: "
              "%s\n",
              s.layers * 5, ok ? "yes" : "NO");
  return ok;
}

bool PrintGraphRows(const Flags& flags, const std::vector<GraphRow>& rows) {
  if (rows.empty()) return true;
  std::printf(
      "\n## CUDA graph: the step captured once and launched (SPEC "
      "§5.7)\n\n"
      "Per k, in this order: eager steps through a fresh Offloader (%d "
      "warm-up, median of %d); the same step captured once (one warm-up "
      "iteration, one captured) and launched (%d untimed, median of %d); a "
      "second capture with the output copied to the host, launched once for "
      "the byte check. Every timed step starts at a cudaDeviceSynchronize "
      "and ends at the next one.\n\n",
      flags.warmup, flags.steps, flags.warmup, flags.steps);
  std::printf("| k | offl. tensors/step | graph nodes | eager step ms | "
              "graph step ms | graph/eager | eager GPU ms | graph GPU ms | "
              "eager host us/step | eager Offloader us/step | graph Launch us "
              "| graph host us/step | eager Offloader us/offl. tensor | graph "
              "host us/offl. tensor | eager act. peak GiB | graph memory GiB "
              "| capture ms | instantiate ms | bit-identical |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|---|---|---|\n");
  bool ok = true;
  for (const GraphRow& r : rows) {
    char per_eager[32] = "-", per_graph[32] = "-";
    if (r.offloaded_tensors > 0) {
      std::snprintf(per_eager, sizeof(per_eager), "%.2f",
                    r.eager_engine_ns / r.offloaded_tensors / 1e3);
      std::snprintf(per_graph, sizeof(per_graph), "%.3f",
                    r.graph_host_ns / r.offloaded_tensors / 1e3);
    }
    std::string same = "yes";
    if (!r.grads_identical || !r.identical) {
      same = std::string("NO (timed graph's gradients ") +
             (r.grads_identical ? "equal" : "differ") +
             ", check graph's output and gradients " +
             (r.identical ? "equal" : "differ") + ")";
      ok = false;
    }
    std::printf("| %d | %.0f | %lld | %.2f | %.2f | x%.3f | %.2f | %.2f | "
                "%.1f | %.1f | %.1f | %.1f | %s | %s | %.2f | %.2f | %.1f | "
                "%.1f | %s |\n",
                r.k, r.offloaded_tensors, (long long)r.nodes,
                r.eager_wall_ns / 1e6, r.graph_wall_ns / 1e6,
                r.graph_wall_ns / r.eager_wall_ns, r.eager_gpu_ns / 1e6,
                r.graph_gpu_ns / 1e6, r.eager_host_ns / 1e3,
                r.eager_engine_ns / 1e3, r.launch_ns / 1e3,
                r.graph_host_ns / 1e3, per_eager, per_graph, GiB(r.eager_peak),
                GiB(r.graph_memory), r.capture_ns / 1e6,
                r.instantiate_ns / 1e6, same.c_str());
  }
  std::printf(
      "\nstep ms: host clock, sync to sync (as the k table). GPU ms: timing "
      "events on the compute stream around the step's work (eager: recorded "
      "before RunStep and after it returns; graph: around Launch). eager "
      "host us/step: RunStep's wall time, all the host does to enqueue a "
      "step (Offloader calls, device allocations and frees, GEMM launches; "
      "a blocking call would count too); eager Offloader us: the part inside "
      "Offloader calls. graph Launch us: the Backend::Launch call "
      "(cudaGraphLaunch); graph host us/step: the whole host side of a "
      "launched step (the start event's record and Launch; no Offloader "
      "call, allocation or GEMM launch runs on the host). Per offloaded "
      "tensor: per step divided by the tensors offloaded per step. eager "
      "act. peak: the device pool's UsedMemHigh over the eager timed steps; "
      "graph memory: the device's graph memory (cudaGraphMemAttrUsedMemHigh "
      "or UsedMemCurrent, the larger) of the timed launches: the memory "
      "nodes' physical memory, another allocator's count. bit-identical: "
      "the timed graph's %d weight gradients, and the check graph's output "
      "and gradients, against the eager step of the same k.\n",
      flags.shape.layers * 5);
  // How the host cost per step moves with the number of tensors.
  double eager_lo = 1e300, eager_hi = 0, graph_lo = 1e300, graph_hi = 0;
  double tensors_lo = 1e300, tensors_hi = 0;
  for (const GraphRow& r : rows) {
    eager_lo = std::min(eager_lo, r.eager_host_ns);
    eager_hi = std::max(eager_hi, r.eager_host_ns);
    graph_lo = std::min(graph_lo, r.graph_host_ns);
    graph_hi = std::max(graph_hi, r.graph_host_ns);
    tensors_lo = std::min(tensors_lo, r.offloaded_tensors);
    tensors_hi = std::max(tensors_hi, r.offloaded_tensors);
  }
  std::printf(
      "host us per step over these rows (%.0f to %.0f offloaded tensors per "
      "step): eager %.1f to %.1f, graph %.1f to %.1f\n",
      tensors_lo, tensors_hi, eager_lo / 1e3, eager_hi / 1e3, graph_lo / 1e3,
      graph_hi / 1e3);
  std::printf("graph rows bit-identical to their eager steps: %s\n",
              ok ? "yes" : "NO");
  return ok;
}

}  // namespace offload::bench
