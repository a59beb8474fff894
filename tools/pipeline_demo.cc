// Fine-grained, pipeline-aware offloading on the simulator: for each of pp
// ranks, the rank's 1F1B (or interleaved 1F1B) schedule of a transformer-
// like model with Megatron's named groups runs once without offloading and
// once through a PipelineOffloader, on a simulated GPU of its own. Prints
// per rank the peak device memory of the last iteration with and without,
// the step-time ratio, the bytes and hazard verdicts, and Megatron's summary
// table of offloaded MB per group name per pipeline rank.
//
//   bazel run //:demo -- --mode=pipeline --pp=4 --vpp=2 --microbatches=8
//       --offload_modules=core_attn,attn_proj,expert_fc1   (one line)

#include "tools/pipeline_demo.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "timeline/sim_timeline.h"
#include "timeline/svg_timeline.h"
#include "timeline/timeline.h"
#include "timeline/trace_json.h"
#include "tools/flag_parser.h"
#include "workload/pipeline_driver.h"
#include "workload/sim_compute.h"

namespace offload {
namespace {

struct Flags {
  PipelineSpec spec;
  std::vector<std::string> modules = {"core_attn", "attn_proj", "expert_fc1",
                                      "moe_act"};
  double fraction = 1.0;
  int64_t delta_mib = 0;
  int max_inflight = -1;  // per offloaded name; -1: no cap
  double gbps = 55.0;
  uint64_t seed = 1;
  int iterations = 2;
  // Megatron's default is 1 Mi elements; the demo's tensors are smaller.
  int64_t min_offload_elements = 64 * 1024;
  // Pictures (timeline/) of one rank's last iteration, without and
  // with offloading; empty: not written.
  std::string trace_json;
  std::string svg;
  int picture_rank = 0;
};

// The group names of the demo's layers (workload/pipeline_driver.h).
const std::vector<std::string> kModules = {"attn_norm", "qkv_linear",
                                           "core_attn", "attn_proj",
                                           "mlp_norm",  "expert_fc1",
                                           "moe_act"};

const char kUsage[] =
    "usage: demo --mode=pipeline --pp=4 --vpp=2 --microbatches=8 "
    "--layers=2 --tokens=256 --hidden=512 --ffn=2048 "
    "--compute_us_per_mib=40 --offload_modules=core_attn,attn_proj,"
    "expert_fc1,moe_act (any of attn_norm, qkv_linear, core_attn, "
    "attn_proj, mlp_norm, expert_fc1, moe_act, or all) --fraction=1.0 "
    "--delta_mib=0 --max_inflight=-1 --gbps=55 --seed=1 --iterations=2 "
    "--min_offload_elements=65536 [--trace_json=FILE] [--svg=FILE] "
    "[--picture_rank=0]\n";

// The module list, or the reason it is refused (an unknown name, named
// with the known ones).
std::string SetModules(const std::string& list, std::vector<std::string>* out) {
  if (list == "all") {
    *out = kModules;
    return "";
  }
  std::vector<std::string> modules = SplitList(list);
  for (const std::string& name : modules) {
    if (std::find(kModules.begin(), kModules.end(), name) == kModules.end()) {
      std::string known;
      for (const std::string& k : kModules) known += (known.empty() ? "" : ", ") + k;
      return "unknown module " + name + " (the demo's layers have " + known +
             "; or all)";
    }
  }
  *out = std::move(modules);
  return "";
}

FlagParser::Result ParseFlags(int argc, char** argv, Flags& f) {
  f.spec.pp = 4;
  f.spec.vpp = 2;
  f.spec.microbatches = 8;
  f.spec.layers = 2;
  f.spec.tokens = 256;
  f.spec.hidden = 512;
  f.spec.ffn = 2048;
  f.spec.compute_ns_per_mib = 40000;
  int64_t compute_us_per_mib = 40;
  FlagParser parser(kUsage);
  parser.Ignore("mode");  // --mode=pipeline
  parser.Int("pp", &f.spec.pp, 1);
  parser.Int("vpp", &f.spec.vpp, 1);
  parser.Int("microbatches", &f.spec.microbatches, 1);
  parser.Int("layers", &f.spec.layers, 1);
  parser.Int64("tokens", &f.spec.tokens, 1);
  parser.Int64("hidden", &f.spec.hidden, 1);
  parser.Int64("ffn", &f.spec.ffn, 1);
  parser.Int64("compute_us_per_mib", &compute_us_per_mib, 0);
  parser.Custom("offload_modules", [&f](const std::string& list) {
    return SetModules(list, &f.modules);
  });
  parser.Double("fraction", &f.fraction, 0);
  parser.Int64("delta_mib", &f.delta_mib, 0);
  parser.Int("max_inflight", &f.max_inflight, -1);
  parser.Double("gbps", &f.gbps, 0, /*min_exclusive=*/true);
  parser.UInt64("seed", &f.seed);
  parser.Int("iterations", &f.iterations, 2);
  parser.Int64("min_offload_elements", &f.min_offload_elements, 0);
  parser.String("trace_json", &f.trace_json);
  parser.String("svg", &f.svg);
  parser.Int("picture_rank", &f.picture_rank, 0);
  FlagParser::Result result = parser.Parse(argc, argv);
  if (result != FlagParser::Result::kOk) return result;
  f.spec.compute_ns_per_mib = compute_us_per_mib * 1000;
  if (f.fraction > 1) {
    return parser.Fail("fraction", std::to_string(f.fraction),
                       "must be between 0 and 1");
  }
  if (f.picture_rank >= f.spec.pp) {
    return parser.Fail("picture_rank", std::to_string(f.picture_rank),
                       "must be below --pp");
  }
  Status valid = ValidatePipelineSpec(f.spec);
  if (!valid.ok()) {
    std::fprintf(stderr, "%s\n%s", valid.ToString().c_str(), kUsage);
    return FlagParser::Result::kError;
  }
  return result;
}

struct RankReport {
  int64_t peak = 0;      // device bytes, last iteration
  int64_t step_ns = 0;   // last iteration
  size_t mismatches = 0;
  int64_t checked = 0;
  size_t hazards = 0;
  std::optional<OffloadSummary> summary;
  std::vector<std::string> warnings;
  std::optional<timeline::Timeline> picture;  // the last iteration
};

StatusOr<RankReport> RunRank(const Flags& f, int rank, bool enabled) {
  SimOptions sim_options;
  sim_options.seed = f.seed + rank;
  sim_options.d2h_gbps = sim_options.h2d_gbps = f.gbps;
  SimBackend sim(sim_options);
  PipelineOffloadOptions options;
  options.enabled = enabled;
  options.offload_modules = f.modules;
  options.min_offload_elements = f.min_offload_elements;
  options.activation_offload_fraction = f.fraction;
  options.delta_offload_bytes = f.delta_mib << 20;
  options.pipeline_rank = rank;
  options.virtual_stages = f.spec.vpp;
  if (f.max_inflight >= 0) {
    for (const std::string& m : f.modules) options.max_inflight[m] = f.max_inflight;
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<PipelineOffloader> offloader,
                           PipelineOffloader::Create(sim, options));
  RankReport report;
  PipelineRunOptions run;
  run.iterations = f.iterations;
  size_t last_begin = 0;  // the trace position where the last iteration began
  std::vector<timeline::SimTimelineOptions::GroupWindow> windows;
  if (rank == f.picture_rank) {
    run.around_commit = [&](int iteration, const ChunkId& chunk,
                            const std::string& group, bool done) {
      if (iteration != f.iterations - 1) return;
      if (!done) {
        windows.push_back({sim.trace().size(), 0, group, chunk.ToString()});
      } else {
        windows.back().end = sim.trace().size();
      }
    };
  }
  run.after_iteration = [&](int iteration) {
    sim.RunUntilIdle();
    report.peak = sim.device_memory().peak_bytes;
    sim.ResetPeaks();
    if (iteration == f.iterations - 2) last_begin = sim.trace().size();
  };
  WorkloadHooks hooks = SimWorkloadHooks(sim);
  OFFLOAD_ASSIGN_OR_RETURN(
      PipelineRankResult result,
      RunPipelineRank(sim, *offloader, f.spec, rank, hooks, run));
  report.step_ns = result.iteration_ns.back();
  report.mismatches = result.mismatches.size();
  report.checked = result.tensors_checked;
  report.hazards = sim.hazards().size();
  report.summary = offloader->summary();
  report.warnings = offloader->diagnostics().warnings();
  if (rank == f.picture_rank && (!f.svg.empty() || !f.trace_json.empty())) {
    timeline::SimTimelineOptions picture;
    picture.title = "pipeline rank " + std::to_string(rank) +
                    (enabled ? ", offloaded" : ", no offloading");
    picture.begin = last_begin;
    picture.group_windows = windows;
    picture.warnings = report.warnings;
    report.picture = timeline::FromSimTrace(sim, picture);
  }
  return report;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int RunPipelineDemo(int argc, char** argv) {
  Flags f;
  const FlagParser::Result parsed = ParseFlags(argc, argv, f);
  if (parsed != FlagParser::Result::kOk) return FlagParser::ExitCode(parsed);
  std::string modules;
  for (const std::string& m : f.modules) modules += (modules.empty() ? "" : ",") + m;
  std::printf("fine-grained offloading: pp %d, vpp %d, %d microbatches, %d "
              "layers per chunk, tokens %" PRId64 ", hidden %" PRId64
              ", ffn %" PRId64 ", bf16\noffloaded modules: %s; fraction %.2f; "
              "delta %" PRId64 " MiB per rank; min %" PRId64
              " elements; copies %.1f GB/s; compute %" PRId64 " us per MiB "
              "written\n\n",
              f.spec.pp, f.spec.vpp, f.spec.microbatches, f.spec.layers,
              f.spec.tokens, f.spec.hidden, f.spec.ffn, modules.c_str(),
              f.fraction, f.delta_mib, f.min_offload_elements, f.gbps,
              f.spec.compute_ns_per_mib / 1000);
  std::printf("%-5s %14s %14s %8s %10s %14s %8s\n", "rank", "peak off MiB",
              "peak on MiB", "mem", "step ratio", "popped bytes", "hazards");
  bool ok = true;
  std::vector<OffloadSummary> summaries;
  std::vector<std::string> warnings;
  std::vector<timeline::Timeline> pictures;
  for (int rank = 0; rank < f.spec.pp; ++rank) {
    StatusOr<RankReport> off = RunRank(f, rank, false);
    StatusOr<RankReport> on = RunRank(f, rank, true);
    if (!off.ok() || !on.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank,
                   (!off.ok() ? off.status() : on.status()).ToString().c_str());
      return 1;
    }
    const size_t wrong = off->mismatches + on->mismatches;
    const size_t hazards = off->hazards + on->hazards;
    ok &= wrong == 0 && hazards == 0;
    std::printf("%-5d %14.1f %14.1f %7.2fx %10.3f %14s %8zu\n", rank,
                MiB(off->peak), MiB(on->peak),
                static_cast<double>(on->peak) / off->peak,
                static_cast<double>(on->step_ns) / off->step_ns,
                wrong == 0 ? "identical" : "WRONG", hazards);
    if (on->summary.has_value()) summaries.push_back(*on->summary);
    if (off->picture.has_value()) pictures.push_back(*off->picture);
    if (on->picture.has_value()) pictures.push_back(*on->picture);
    for (const std::string& w : on->warnings) {
      warnings.push_back("rank " + std::to_string(rank) + ": " + w);
    }
  }
  std::printf("\n(peaks and step times of the last of %d iterations; the "
              "first is the warm-up)\n\n%s",
              f.iterations, FormatSummaryTable(summaries).c_str());
  for (const std::string& w : warnings) {
    std::printf("engine warning: %s\n", w.c_str());
  }
  auto write = [&](const std::string& path, const std::string& text) {
    std::FILE* file = std::fopen(path.c_str(), "w");
    bool written = file != nullptr &&
                   std::fwrite(text.data(), 1, text.size(), file) == text.size();
    if (file != nullptr) written &= std::fclose(file) == 0;
    std::printf(written ? "wrote %s\n" : "cannot write %s\n", path.c_str());
    return written;
  };
  if (!f.trace_json.empty()) {
    ok &= write(f.trace_json, timeline::ToChromeTraceJson(pictures));
  }
  if (!f.svg.empty()) ok &= write(f.svg, timeline::ToSvg(pictures));
  return ok ? 0 : 1;
}

}  // namespace offload
