// GPU benchmark of the fine-grained (pipeline) front door, PipelineOffloader
// (SPEC §5), on the layer stack's bf16 GEMM workload (layer_stack.h), one
// chunk on pipeline rank 0. See docs/benchmarks.md, "Fine-grained (pipeline)
// mode on the GPU".
//
//   pipeline_bench [--hidden=4096] [--tokens=8192] [--layers=8] [--steps=5]
//                  [--warmup=2]        (run_pipeline_bench.sh: --steps=10)
//                  [--pp=1 --microbatches=1]
//
// With --pp and --microbatches, each step is pipeline rank 0's 1F1B schedule
// of that many microbatches (e.g. F0 F1 B0 F2 B1 F3 B2 B3 for 2 and 4), each
// a chunk of --layers layers (pipeline_step.h): a chunk's first reloads can
// then hide behind the next microbatch's forward (SPEC §5.3).
//
// Configurations: no offloading (enabled=false, the baseline), then the
// module sets {core_attn}, {core_attn, attn_proj}, {qkv_linear, core_attn,
// attn_proj} and all five groups, each at activation_offload_fraction 1.0 and
// 0.5, then the baseline again (drift within the run). Per configuration:
// --warmup steps (the first is the engine's warm-up, which freezes the plan),
// --steps timed steps (host wall time from a device sync to the next; the
// median), the device pool's UsedMemHigh over the timed steps, the D2H bytes
// the engine enqueued per timed step, and one more step whose output and 40
// weight gradients are hashed and compared with the baseline's.
//
// limit = max(baseline step, offloaded bytes / pinned D2H peak, offloaded
// bytes / pinned H2D peak): no schedule that moves those bytes over PCIe in
// each direction, and does the baseline's compute, can be faster. The peaks
// are raw cudaMemcpyAsync, one direction alone (pinned_bandwidth.h).
//
// Exits 1 if any configuration is not bit-identical to the baseline.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "bench/flags.h"
#include "bench/gpu_exec.h"
#include "bench/layer_stack.h"
#include "bench/pinned_bandwidth.h"
#include "bench/pipeline_step.h"
#include "engine/pipeline_offload.h"
#include "engine/pipeline_summary.h"

namespace offload::bench {
namespace {

struct Config {
  bool enabled = true;
  std::vector<std::string> modules;
  double fraction = 1.0;
  std::string label;  // the table's "modules" cell
};

struct Row {
  Config config;
  double step_ns = 0, min_ns = 0, max_ns = 0;
  uint64_t peak = 0;
  double offloaded_per_step = 0, reloaded_per_step = 0;
  double host_us_per_step = 0;
  int groups = 0, offloaded_groups = 0;  // of the frozen plan
  std::vector<uint64_t> hashes;
};

std::vector<Config> Configs() {
  std::vector<Config> c;
  c.push_back({false, {}, 1.0, "none (baseline)"});
  const std::vector<std::vector<std::string>> sets = {
      {"core_attn"},
      {"core_attn", "attn_proj"},
      {"qkv_linear", "core_attn", "attn_proj"},
      {"qkv_linear", "core_attn", "attn_proj", "expert_fc1", "moe_act"}};
  for (const auto& set : sets) {
    std::string label;
    for (const std::string& m : set) label += (label.empty() ? "" : ", ") + m;
    if (set.size() == 5) label = "all five";
    for (double f : {1.0, 0.5}) c.push_back({true, set, f, label});
  }
  c.push_back({false, {}, 1.0, "none (again, last)"});
  return c;
}

Row RunConfig(GpuExec& ex, CudaBackend& be, const Flags& flags,
              const Config& cfg) {
  const Shape& s = flags.shape;
  PipelineOffloadOptions o;
  o.enabled = cfg.enabled;
  o.offload_modules = cfg.modules;
  o.activation_offload_fraction = cfg.fraction;
  o.pipeline_rank = 0;
  o.virtual_stages = 1;
  auto off = Must(PipelineOffloader::Create(be, o), "PipelineOffloader::Create");
  const std::vector<PipelineStep> schedule =
      OneFOneB(flags.pp, flags.microbatches);
  for (int w = 0; w < flags.warmup; ++w) {
    RunPipelineSchedule(ex, *off, s, schedule);
  }
  Cuda(cudaDeviceSynchronize(), "sync");

  unsigned long long zero = 0;
  Cuda(cudaMemPoolSetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                               &zero),
       "reset UsedMemHigh");
  const OffloaderStats st0 = off->stats();
  std::vector<double> times;
  double host_ns = 0;
  for (int i = 0; i < flags.steps; ++i) {
    Cuda(cudaDeviceSynchronize(), "sync");
    Clock::time_point t0 = Clock::now();
    host_ns += RunPipelineSchedule(ex, *off, s, schedule).engine_host_ns;
    Cuda(cudaDeviceSynchronize(), "sync");
    times.push_back(NsSince(t0));
  }
  const OffloaderStats st1 = off->stats();
  unsigned long long high = 0;
  Cuda(cudaMemPoolGetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                               &high),
       "UsedMemHigh");

  Row row;
  row.config = cfg;
  row.step_ns = Median(times);
  row.min_ns = row.max_ns = times[0];
  for (double t : times) {
    row.min_ns = std::min(row.min_ns, t);
    row.max_ns = std::max(row.max_ns, t);
  }
  row.peak = high;
  row.offloaded_per_step =
      double(st1.bytes_offloaded - st0.bytes_offloaded) / flags.steps;
  row.reloaded_per_step =
      double(st1.bytes_reloaded - st0.bytes_reloaded) / flags.steps;
  row.host_us_per_step = host_ns / flags.steps / 1e3;

  // One more step, output and weight gradients hashed.
  ex.set_capture(true);
  RunPipelineSchedule(ex, *off, s, schedule);
  Cuda(cudaDeviceSynchronize(), "sync");
  ex.set_capture(false);
  row.hashes = ex.Hashes();

  if (off->summary().has_value()) {
    for (const GroupNameSummary& n : off->summary()->names) {
      row.groups += n.groups;
      row.offloaded_groups += n.offloaded_groups;
    }
    if (cfg.enabled) {
      std::fprintf(stderr, "%s\n",
                   FormatSummaryTable({*off->summary()}).c_str());
    }
  }
  std::fprintf(stderr,
               "%s, fraction %.1f: step %.2f ms (min %.2f, max %.2f), "
               "peak %.3f GiB, D2H %.3f GiB/step, H2D %.3f GiB/step, "
               "groups offloaded %d/%d, host %.1f us/step in engine calls\n",
               cfg.label.c_str(), cfg.fraction, row.step_ns / 1e6,
               row.min_ns / 1e6, row.max_ns / 1e6, GiB(double(high)),
               GiB(row.offloaded_per_step), GiB(row.reloaded_per_step),
               row.offloaded_groups, row.groups, row.host_us_per_step);
  for (const std::string& w : off->diagnostics().warnings()) {
    std::fprintf(stderr, "  engine warning: %s\n", w.c_str());
  }
  return row;
}

int Main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  if (flags.steps < 1 || flags.warmup < 2) {
    Die("--steps must be >= 1 and --warmup >= 2 (the first step is the "
        "engine's warm-up)");
  }
  if (flags.pp < 1 || flags.microbatches < 1) {
    Die("--pp and --microbatches must be >= 1");
  }
  const Shape& s = flags.shape;
  std::unique_ptr<CudaBackend> be =
      Must(NewCudaBackend(CudaOptions{}), "NewCudaBackend");
  if (SeenMemPool() == nullptr) Die("the backend's device pool was not seen");
  cudaDeviceProp prop{};
  Cuda(cudaGetDeviceProperties(&prop, be->device()), "props");
  const double saved_per_layer = double(s.tokens * s.hidden * 2) * 10;
  std::printf("# %s, PipelineOffloader (pipeline rank 0 of %d, 1F1B over %d "
              "microbatch(es), one chunk each), hidden %lld, %lld tokens, %d "
              "layers, %.0f MiB saved per layer in 5 groups\n",
              prop.name, flags.pp, flags.microbatches, (long long)s.hidden,
              (long long)s.tokens, s.layers, saved_per_layer / (1 << 20));
  std::printf("# %d warm-up steps (the first is the engine's warm-up), %d "
              "timed steps (median of host wall time between device syncs)\n",
              flags.warmup, flags.steps);

  const PinnedPeak peak = MeasurePinnedPeak(size_t(s.tokens * s.hidden * 2));
  const double d2h = peak.d2h(), h2d = peak.h2d();
  std::printf("# pinned peak, raw cudaMemcpyAsync, one direction alone (best "
              "of %.0f MiB, 16 MiB, 256 MiB chunks): D2H %.2f GB/s, H2D %.2f "
              "GB/s; both directions at once (256 MiB): D2H %.2f, H2D %.2f "
              "GB/s\n",
              peak.span_small / double(1 << 20), d2h, h2d, peak.big.both_d2h,
              peak.big.both_h2d);
  std::fflush(stdout);

  GpuExec ex(*be, s);
  std::vector<Row> rows;
  for (const Config& cfg : Configs()) {
    rows.push_back(RunConfig(ex, *be, flags, cfg));
  }

  const Row& base = rows[0];
  const double base_ms = base.step_ns / 1e6;
  std::printf("\nlimit = max(baseline step, offloaded bytes / D2H peak, "
              "offloaded bytes / H2D peak), with the baseline's median step "
              "%.2f ms and the peaks above: a lower bound for any schedule "
              "that moves those bytes each way.\n\n",
              base_ms);
  std::printf("| modules | fraction | groups offloaded | step ms | ratio | "
              "peak GiB | ratio | offloaded GiB/step | limit ms | "
              "measured/limit | bit-identical |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool all_identical = true;
  for (const Row& r : rows) {
    const double ms = r.step_ns / 1e6;
    const double b = r.offloaded_per_step;
    const double limit_ms =
        std::max({base_ms, b / (d2h * 1e6), b / (h2d * 1e6)});
    const bool identical = r.hashes == base.hashes;
    all_identical = all_identical && identical;
    const std::string frac =
        r.config.enabled ? std::to_string(r.config.fraction).substr(0, 3) : "–";
    const std::string groups =
        r.groups ? std::to_string(r.offloaded_groups) + "/" +
                       std::to_string(r.groups)
                 : "–";
    std::printf("| %s | %s | %s | %.2f | ×%.3f | %.2f | ×%.2f | %.2f | "
                "%.2f | %.3f | %s |\n",
                r.config.label.c_str(), frac.c_str(), groups.c_str(), ms, ms / base_ms, GiB(double(r.peak)),
                double(r.peak) / double(base.peak), GiB(b), limit_ms,
                ms / limit_ms, identical ? "yes" : "**no**");
  }
  std::printf("\n%s\n", all_identical
                            ? "every configuration bit-identical to the "
                              "baseline (output and all weight gradients)"
                            : "NOT bit-identical: see the table");
  return all_identical ? 0 : 1;
}

}  // namespace
}  // namespace offload::bench

int main(int argc, char** argv) { return offload::bench::Main(argc, argv); }
