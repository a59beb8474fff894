#include "bench/report.h"

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
    std::snprintf(text, sizeof(text), "budget k=%g", r.budget_k);
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
  for (const SweepRow& r : rows) any = any || r.k < 0;
  if (!any) return;
  std::printf("\n## Byte budget (SPEC §4.7) against k of %d layers\n\n"
              "Budget = the saved bytes of layers - k layers (what k-of-n keeps "
              "resident by SPEC §4.1). TE k-of-n columns: this run's rows at "
              "floor(k) / ceil(k).\n\n", s.layers);
  std::printf("| budget k | budget GiB | step ms | ratio | act. peak GiB | "
              "ratio | k-of-n ratio (floor/ceil) | k-of-n peak ratio | "
              "bound ms | measured/bound | offloaded GiB/step | "
              "host us/offl. tensor | bit-identical | fwd ms/layer (own) | "
              "bwd ms/layer (own) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SweepRow& r : rows) {
    if (r.k >= 0) continue;
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
                "%.3f | %.2f | %.2f | %s | %.3f | %.3f |\n",
                r.budget_k, GiB(r.budget_bytes), r.step_ns / 1e6,
                r.step_ns / r0.step_ns, GiB(r.peak),
                double(r.peak) / double(r0.peak), te, te_peak,
                r.bound_ns / 1e6, r.step_ns / r.bound_ns, GiB(r.d2h_bytes),
                r.host_ns_per_offloaded / 1e3, r.identical ? "yes" : "NO",
                r.fwd_ns / 1e6, r.bwd_ns / 1e6);
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
  bool ok = true;
  for (const SweepRow& r : rows) ok = ok && r.identical;
  std::printf("\noutputs and all %d weight gradients bit-identical to k=0: "
              "%s\n",
              s.layers * 5, ok ? "yes" : "NO");
  return ok;
}

}  // namespace offload::bench
