// The limit for a memory budget (limit.h, docs/limit.md) of the layer
// stack, as a table: budget -> the least step time any schedule within it
// can have, next to the engine's k-of-n schedule on the simulator and the
// measured steps. Runs on the build machine (GLPK).
//
//   limit_tool --results=bench/results/.../h4096.md [--budgets=LIST]
//   limit_tool --hidden=4096 --tokens=8192 [--layers=8] --gemm_ms=a,b,...
//              --d2h_gbps=55.3 --h2d_gbps=55.3 [--both_d2h_gbps=51
//              --both_h2d_gbps=51] [--push_at=gemm|layer] [--budgets=LIST]
//
// --results reads the shape, the per-GEMM times, the pinned peaks (the
// largest of each column) and the measured steps from layer_stack_bench's
// output; the other flags override them. LIST is comma-separated budgets:
//   k3      the activation peak of the engine's k-of-n schedule with k = 3
//           offloaded layers (simulator); k2.5 interpolates k2 and k3
//   2.5GiB  bytes (also MiB, or plain bytes)
//   0.6x    a fraction of the no-offload peak
// Default: k1, k1.5, ..., k(layers - 2).
// For "k" budgets the last three columns give the limit for the engine's
// own definition of a byte budget (saved tensors only: layers - k layers'
// saved bytes, the unsaved last output not counted; stack_limit.h
// BudgetCounts), the measured byte budget against it, and the engine's
// byte-budget schedule on the simulator (as "k-of-n sim").

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_output.h"
#include "bench/bench_util.h"
#include "bench/layer_stack.h"
#include "bench/layer_stack_timeline.h"
#include "bench/limit.h"
#include "bench/sim_bound.h"
#include "bench/stack_limit.h"

namespace offload::bench {
namespace {

struct ToolFlags {
  BenchOutput in;  // from --results, then the flags
  bool have_results = false;
  std::vector<std::string> budgets;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

ToolFlags ParseToolFlags(int argc, char** argv) {
  ToolFlags f;
  f.in.shape = Shape();
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--results=", 0) == 0) {
      std::ifstream file(a.substr(10));
      if (!file) Die("cannot read " + a.substr(10));
      std::stringstream text;
      text << file.rdbuf();
      f.in = Must(ParseBenchOutput(text.str()), "--results");
      f.have_results = true;
    } else {
      rest.push_back(a);
    }
  }
  for (const std::string& a : rest) {
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : a.substr(eq + 1);
    LimitBandwidth& b = f.in.bandwidth;
    if (name == "--hidden") f.in.shape.hidden = std::atoll(v.c_str());
    else if (name == "--tokens") f.in.shape.tokens = std::atoll(v.c_str());
    else if (name == "--layers") f.in.shape.layers = std::atoi(v.c_str());
    else if (name == "--d2h_gbps") b.d2h = std::atof(v.c_str());
    else if (name == "--h2d_gbps") b.h2d = std::atof(v.c_str());
    else if (name == "--both_d2h_gbps") b.both_d2h = std::atof(v.c_str());
    else if (name == "--both_h2d_gbps") b.both_h2d = std::atof(v.c_str());
    else if (name == "--budgets") f.budgets = Split(v);
    else if (name == "--push_at" && (v == "gemm" || v == "layer")) {
      f.in.shape.push_at = v == "gemm" ? PushAt::kGemm : PushAt::kLayer;
    } else if (name == "--gemm_ms") {
      const std::vector<std::string> ms = Split(v);
      if (ms.size() != size_t(kGemms)) Die("--gemm_ms needs 15 values");
      for (int g = 0; g < kGemms; ++g) f.in.gemm_ms[g] = std::atof(ms[g].c_str());
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.in.gemm_ms[0] <= 0) Die("give --results or --gemm_ms");
  if (f.in.bandwidth.d2h <= 0 || f.in.bandwidth.h2d <= 0) {
    Die("give --results or --d2h_gbps and --h2d_gbps");
  }
  if (f.budgets.empty()) {
    for (int h = 2; h <= 2 * (f.in.shape.layers - 2); ++h) {
      f.budgets.push_back(h % 2 ? "k" + std::to_string(h / 2) + ".5"
                                : "k" + std::to_string(h / 2));
    }
  }
  return f;
}

// The engine's k-of-n schedule on the simulator, per k (cached).
class KOfN {
 public:
  explicit KOfN(const BenchOutput& in) : in_(in) {
    for (int g = 0; g < kGemms; ++g) ns_[g] = in.gemm_ms[g] * 1e6;
  }
  const SimResult& At(int k) {
    if (k < 0 || k >= in_.shape.layers) Die("k outside [0, layers)");
    if (int(runs_.size()) <= k) runs_.resize(k + 1);
    if (runs_[k].step_ns == 0) {
      runs_[k] = SimulateSchedule(in_.shape, k, ns_, in_.bandwidth.d2h,
                                  in_.bandwidth.h2d);
    }
    return runs_[k];
  }

 private:
  const BenchOutput& in_;
  std::array<double, kGemms> ns_{};
  std::vector<SimResult> runs_;
};

// A budget of --budgets in bytes; `k` is set for "k<integer>".
int64_t BudgetBytes(const std::string& b, KOfN& kofn, int* k) {
  *k = -1;
  const double no_offload = double(kofn.At(0).peak_bytes);
  char* end = nullptr;
  if (b[0] == 'k') {
    const double kk = std::strtod(b.c_str() + 1, &end);
    const int lo = int(std::floor(kk));
    if (kk == lo) *k = lo;
    const double p_lo = double(kofn.At(lo).peak_bytes);
    if (kk == lo) return int64_t(p_lo);
    const double p_hi = double(kofn.At(lo + 1).peak_bytes);
    return int64_t(p_lo + (kk - lo) * (p_hi - p_lo));
  }
  const double v = std::strtod(b.c_str(), &end);
  const std::string unit = end;
  if (unit == "x") return int64_t(v * no_offload);
  if (unit == "GiB") return int64_t(v * (1 << 30));
  if (unit == "MiB") return int64_t(v * (1 << 20));
  if (unit.empty()) return int64_t(v);
  Die("unknown budget " + b);
}

int Main(int argc, char** argv) {
  const ToolFlags f = ParseToolFlags(argc, argv);
  const BenchOutput& in = f.in;
  const Shape& s = in.shape;
  const StackTimeline timeline = RecordTimeline(s);
  KOfN kofn(in);
  const LimitBandwidth& bw = in.bandwidth;
  std::printf("# limit_tool: layers %d, hidden %lld, tokens %lld, "
              "--push_at=%s; pinned GB/s: D2H %.1f, H2D %.1f alone, "
              "%.1f / %.1f both at once\n",
              s.layers, (long long)s.hidden, (long long)s.tokens,
              PushAtName(s.push_at), bw.d2h, bw.h2d,
              bw.both_d2h > 0 ? bw.both_d2h : bw.d2h,
              bw.both_h2d > 0 ? bw.both_h2d : bw.h2d);
  double kernels = 0;
  for (const StackKernel& k : timeline.kernels) kernels += in.gemm_ms[k.gemm];
  const double step0 = f.have_results ? in.rows[0].step_ms : 0;
  std::printf("# kernels: %.2f ms per step; no-offload activation peak "
              "%.3f GiB%s\n\n",
              kernels, GiB(double(kofn.At(0).peak_bytes)),
              f.have_results ? "; measured k=0 step in --results" : "");
  std::printf("| budget | GiB | x peak | limit ms | limit / kernels | "
              "k-of-n sim ms | k-of-n sim / limit | measured ms | "
              "measured ratio | measured / limit | measured / limit (own "
              "GEMMs) | byte budget ms | byte budget ratio | byte budget / "
              "limit | byte budget / limit (own GEMMs) | limit, saved "
              "only, ms | byte budget / limit saved only (own GEMMs) | "
              "byte budget sim ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|---|---|\n");
  // The GEMMs run at different speeds from configuration to configuration
  // (the H200's power cap moves its clock): a row is also compared with the
  // limit for its own calibrated GEMM times (k = 0's per-GEMM times scaled
  // to that row's per-layer sum).
  const double k0_layer_ms =
      f.have_results && !in.rows.empty() ? in.rows[0].own_layer_ms : 0;
  auto limit_ms = [&](int64_t bytes, double scale,
                      BudgetCounts counts = BudgetCounts::kAllActivations) {
    std::array<double, kGemms> ms = in.gemm_ms;
    for (double& m : ms) m *= scale;
    const LimitResult r = Must(
        ComputeLimit(StackLimitProblem(timeline, ms, bw, bytes, counts)),
        "ComputeLimit");
    return r.feasible ? r.step_ms : -1.0;
  };
  auto versus = [&](const BenchRow* row, int64_t bytes, double limit) {
    if (row == nullptr || !f.have_results) {
      std::printf("- | - | - | - | ");
      return;
    }
    std::printf("%.2f | x%.3f | %.3f | ", row->step_ms, row->step_ms / step0,
                row->step_ms / limit);
    if (row->own_layer_ms > 0 && k0_layer_ms > 0) {
      const double own = limit_ms(bytes, row->own_layer_ms / k0_layer_ms);
      std::printf("%.3f | ", row->step_ms / own);
    } else {
      std::printf("- | ");
    }
  };
  for (const std::string& b : f.budgets) {
    int k = -1;
    const int64_t bytes = BudgetBytes(b, kofn, &k);
    const double limit = limit_ms(bytes, 1.0);
    std::printf("| %s | %.3f | x%.3f | ", b.c_str(), GiB(double(bytes)),
                double(bytes) / double(kofn.At(0).peak_bytes));
    if (limit < 0) {
      std::printf("infeasible | - | - | - | - | - | - | - | - | - | - | - | "
                  "- | - | - |\n");
      continue;
    }
    std::printf("%.2f | x%.3f | ", limit, limit / kernels);
    if (k >= 0) {
      const double sim = kofn.At(k).step_ns / 1e6;
      std::printf("%.2f | %.3f | ", sim, sim / limit);
    } else {
      std::printf("- | - | ");
    }
    const BenchRow* row = nullptr;
    for (const BenchRow& br : in.rows) {
      if (br.k == k) row = &br;
    }
    versus(row, bytes, limit);
    // The byte-budget row of the same "k" (its peak is this budget: the
    // saved bytes of layers - k layers plus the unsaved last output).
    const BenchRow* budget_row = nullptr;
    for (const BenchRow& br : in.budget_rows) {
      if (b[0] == 'k' &&
          std::abs(br.budget_k - std::atof(b.c_str() + 1)) < 1e-9) {
        budget_row = &br;
      }
    }
    versus(budget_row, bytes, limit);
    // The limit for the engine's own definition of the budget: the saved
    // bytes of layers - k layers, the unsaved output not counted.
    if (b[0] == 'k') {
      const int64_t saved = BudgetForK(s, std::atof(b.c_str() + 1));
      const double limit_saved = limit_ms(saved, 1.0, BudgetCounts::kSavedOnly);
      std::printf("%.2f | ", limit_saved);
      if (budget_row != nullptr && budget_row->own_layer_ms > 0 &&
          k0_layer_ms > 0 && limit_saved > 0) {
        const double own = limit_ms(saved, budget_row->own_layer_ms / k0_layer_ms,
                                    BudgetCounts::kSavedOnly);
        std::printf("%.3f | ", budget_row->step_ms / own);
      } else {
        std::printf("- | ");
      }
      // The engine's byte-budget schedule on the simulator (k = 0's GEMM
      // times, the link alone; three steps, the first recorded).
      std::array<double, kGemms> ns{};
      for (int g = 0; g < kGemms; ++g) ns[g] = in.gemm_ms[g] * 1e6;
      const SimResult sim = SimulateSchedule(
          s, BenchOptions(s, 0, std::atof(b.c_str() + 1), false), ns, bw.d2h,
          bw.h2d);
      std::printf("%.2f | ", sim.step_ns / 1e6);
    } else {
      std::printf("- | - | - | ");
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace offload::bench

int main(int argc, char** argv) { return offload::bench::Main(argc, argv); }
