// The project's main job (README's first command, `bazel run //:demo`): a
// layer stack run on the simulated GPU through the real Offloader, once
// without offloading and once with the first k layers offloaded. Prints the
// per-layer timeline of the offloaded run in virtual time (compute, D2H and
// H2D, start..end), the peak device memory of both runs and their step-time
// ratio; checks every popped byte (when the sizes allow the simulator to keep
// bytes) and the hazard detector's verdict.
//
//   bazel run //:demo -- --layers=8 --offloaded=2 --mib_per_layer=128
//       --compute_us=3000 --gbps=55 --latency_us=2 --seed=1   (one line)

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "timeline/sim_timeline.h"
#include "timeline/svg_timeline.h"
#include "timeline/timeline.h"
#include "timeline/trace_json.h"
#include "tools/flag_parser.h"
#include "tools/pipeline_demo.h"
#include "workload/sim_compute.h"
#include "workload/workload.h"

namespace offload {
namespace {

struct Flags {
  int layers = 8;
  int offloaded = 2;
  int64_t mib_per_layer = 128;
  int tensors_per_layer = 4;
  int64_t compute_us = 3000;  // forward; backward takes twice as long
  double gbps = 55.0;
  double latency_us = 2.0;
  uint64_t seed = 1;
  int iterations = 2;
  int64_t min_offload_elements = 256 * 1024;
  // The simulator keeps (and the demo checks) bytes up to this many MiB of
  // activations per run; larger runs simulate timing only (so does the
  // default run, 8 layers of 128 MiB: checking 1 GiB twice takes over a
  // minute in a fastbuild).
  int64_t max_checked_mib = 512;
  // Pictures of the last iteration of both runs (timeline/): Chrome
  // trace-event JSON and a TE-style SVG; empty: not written.
  std::string trace_json;
  std::string svg;
};

const char kUsage[] =
    "usage: demo [--mode=layer] --layers=8 --offloaded=2 --mib_per_layer=128 "
    "--tensors_per_layer=4 --compute_us=3000 --gbps=55 --latency_us=2 "
    "--seed=1 --iterations=2 --min_offload_elements=262144 "
    "--max_checked_mib=512 [--trace_json=FILE] [--svg=FILE]\n"
    "       demo --mode=pipeline --help   (Megatron's fine-grained mode)\n";

// Parses --name=value flags into `flags`: kOk, kHelp (usage printed) or
// kError (a message naming the flag, its value and the reason).
FlagParser::Result ParseFlags(int argc, char** argv, Flags& flags) {
  FlagParser parser(kUsage);
  parser.Int("layers", &flags.layers, 1);
  parser.Int("offloaded", &flags.offloaded, 0);
  parser.Int64("mib_per_layer", &flags.mib_per_layer, 1);
  parser.Int("tensors_per_layer", &flags.tensors_per_layer, 1);
  parser.Int64("compute_us", &flags.compute_us, 0);
  parser.Double("gbps", &flags.gbps, 0, /*min_exclusive=*/true);
  parser.Double("latency_us", &flags.latency_us, 0);
  parser.UInt64("seed", &flags.seed);
  parser.Int("iterations", &flags.iterations, 1);
  parser.Int64("min_offload_elements", &flags.min_offload_elements, 0);
  parser.Int64("max_checked_mib", &flags.max_checked_mib, 0);
  parser.String("trace_json", &flags.trace_json);
  parser.String("svg", &flags.svg);
  parser.Ignore("mode");  // --mode=layer
  FlagParser::Result result = parser.Parse(argc, argv);
  if (result == FlagParser::Result::kOk && flags.offloaded > flags.layers - 1) {
    result = parser.Fail("offloaded", std::to_string(flags.offloaded),
                         "must be at most --layers - 1 = " +
                             std::to_string(flags.layers - 1) +
                             " (the last layer is never offloaded)");
  }
  return result;
}

// [start, end] of some work in virtual ns; start < 0 when there was none.
struct Interval {
  int64_t start = -1;
  int64_t end = -1;
  void Add(int64_t s, int64_t e) {
    if (start < 0 || s < start) start = s;
    if (e > end) end = e;
  }
};

struct LayerTimeline {
  Interval forward, d2h, h2d, backward;
};

struct RunReport {
  int64_t step_ns = 0;        // the last iteration
  int64_t iteration_start_ns = 0;
  SimMemoryStats device;
  SimMemoryStats pinned;
  size_t hazards = 0;
  std::vector<std::string> hazard_text;
  bool bytes_checked = false;
  int64_t tensors_checked = 0;
  std::vector<std::string> mismatches;
  std::vector<std::string> warnings;
  OffloaderStats stats;
  std::vector<LayerTimeline> timeline;
  timeline::Timeline picture;  // the last iteration
};

// The per-layer table of the last iteration, read off its Timeline
// (timeline/sim_timeline.h attributes copies to layers).
std::vector<LayerTimeline> LayerTable(const timeline::Timeline& t,
                                      int layers) {
  std::vector<LayerTimeline> table(layers);
  for (const timeline::Slice& s : t.slices) {
    int layer = -1;
    Interval LayerTimeline::*column = nullptr;
    switch (s.kind) {
      case timeline::SliceKind::kForward:
      case timeline::SliceKind::kBackward:
        for (int i = 0; i < layers; ++i) {
          const std::string suffix = " L" + std::to_string(i);
          if (s.name == (s.kind == timeline::SliceKind::kForward ? "forward"
                                                                 : "backward") +
                            suffix) {
            layer = i;
          }
        }
        column = s.kind == timeline::SliceKind::kForward
                     ? &LayerTimeline::forward
                     : &LayerTimeline::backward;
        break;
      case timeline::SliceKind::kD2H:
      case timeline::SliceKind::kH2D:
        if (s.args.count("layer")) layer = std::atoi(s.args.at("layer").c_str());
        column = s.kind == timeline::SliceKind::kD2H ? &LayerTimeline::d2h
                                                     : &LayerTimeline::h2d;
        break;
      default:
        break;
    }
    if (layer >= 0 && layer < layers) {
      (table[layer].*column).Add(s.start_ns, s.end_ns);
    }
  }
  return table;
}

StatusOr<RunReport> RunOnce(const Flags& flags, int offloaded,
                            bool store_bytes) {
  SimOptions sim_options;
  sim_options.seed = flags.seed;
  sim_options.d2h_gbps = sim_options.h2d_gbps = flags.gbps;
  sim_options.copy_latency_ns = static_cast<int64_t>(flags.latency_us * 1000);
  sim_options.store_bytes = store_bytes;
  std::unique_ptr<SimBackend> sim = NewSimBackend(sim_options);

  OffloadOptions options;
  options.model_layers = flags.layers;
  options.offloaded_layers = offloaded;
  options.min_offload_elements = flags.min_offload_elements;
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Offloader> offloader,
                           Offloader::Create(*sim, options));

  const int64_t forward_ns = flags.compute_us * 1000;
  WorkloadSpec spec = UniformWorkloadSpec(
      flags.layers, flags.mib_per_layer << 20, flags.tensors_per_layer,
      forward_ns, 2 * forward_ns);
  spec.seed = flags.seed;

  // Trace positions at the start of each layer's forward in the last
  // iteration, and where that iteration begins.
  const int last = flags.iterations - 1;
  std::vector<size_t> marks(flags.layers, 0);
  size_t iteration_begin = 0;
  int64_t iteration_start_ns = 0;
  WorkloadHooks hooks = SimWorkloadHooks(*sim);
  SimBackend& s = *sim;
  hooks.observer = [&](const WorkloadEvent& event) {
    if (event.iteration != last) return;
    if (event.phase == WorkloadPhase::kForwardBegin) {
      marks[event.layer] = s.trace().size();
      if (event.layer == 0) {
        iteration_begin = s.trace().size();
        iteration_start_ns = s.NowNs();
      }
    }
  };
  WorkloadOptions run;
  run.iterations = flags.iterations;
  run.check_bytes = store_bytes;
  run.min_offload_elements = flags.min_offload_elements;
  OFFLOAD_ASSIGN_OR_RETURN(WorkloadResult result,
                           RunWorkload(*sim, *offloader, spec, hooks, run));
  sim->RunUntilIdle();

  RunReport report;
  report.step_ns = result.iteration_ns.back();
  report.iteration_start_ns = iteration_start_ns;
  report.device = sim->device_memory();
  report.pinned = sim->pinned_memory();
  report.hazards = sim->hazards().size();
  for (const Hazard& hazard : sim->hazards()) {
    report.hazard_text.push_back(hazard.ToString());
  }
  report.bytes_checked = store_bytes;
  report.tensors_checked = result.tensors_checked;
  for (const Mismatch& m : result.mismatches) {
    report.mismatches.push_back(m.ToString());
  }
  report.warnings = offloader->diagnostics().warnings();
  report.stats = offloader->stats();
  timeline::SimTimelineOptions picture;
  picture.title = offloaded == 0
                      ? "no offloading"
                      : std::to_string(offloaded) + " of " +
                            std::to_string(flags.layers) +
                            " layers offloaded";
  picture.begin = iteration_begin;
  picture.layer_marks = marks;
  if (offloaded > 0) {
    picture.budget_bytes =
        (flags.layers - offloaded) * (flags.mib_per_layer << 20);
    picture.budget_label = "budget: n - k = " +
                           std::to_string(flags.layers - offloaded) +
                           " layers";
  }
  picture.warnings = report.warnings;
  report.picture = timeline::FromSimTrace(*sim, picture);
  report.timeline = LayerTable(report.picture, flags.layers);
  return report;
}

std::string Cell(const Interval& interval, int64_t origin_ns) {
  if (interval.start < 0) return "-";
  char text[48];
  std::snprintf(text, sizeof(text), "%.1f..%.1f",
                (interval.start - origin_ns) / 1e3,
                (interval.end - origin_ns) / 1e3);
  return text;
}

double MiB(int64_t bytes) { return bytes / 1048576.0; }

bool WriteFile(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  const bool ok = file != nullptr &&
                  std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (file != nullptr && std::fclose(file) != 0) return false;
  if (!ok) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  else std::printf("wrote %s\n", path.c_str());
  return ok;
}

int Run(const Flags& flags) {
  const bool store_bytes =
      flags.layers * flags.mib_per_layer <= flags.max_checked_mib;
  StatusOr<RunReport> base = RunOnce(flags, 0, store_bytes);
  if (!base.ok()) {
    std::fprintf(stderr, "run without offloading: %s\n",
                 base.status().ToString().c_str());
    return 1;
  }
  StatusOr<RunReport> off = RunOnce(flags, flags.offloaded, store_bytes);
  if (!off.ok()) {
    std::fprintf(stderr, "run with %d offloaded layers: %s\n", flags.offloaded,
                 off.status().ToString().c_str());
    return 1;
  }

  std::printf(
      "offload demo on the simulated GPU: %d layers x %" PRId64
      " MiB of activations (%d tensors each), first %d offloaded\n"
      "forward %" PRId64 " us / backward %" PRId64
      " us per layer; copies %.1f GB/s per direction, %.1f us latency; "
      "seed %" PRIu64 "; %d iterations\n\n",
      flags.layers, flags.mib_per_layer, flags.tensors_per_layer,
      flags.offloaded, flags.compute_us, 2 * flags.compute_us, flags.gbps,
      flags.latency_us, flags.seed, flags.iterations);

  std::printf("timeline of the last iteration with %d offloaded layers "
              "(us from its start)\n",
              flags.offloaded);
  std::printf("%-6s %-22s %-22s %-22s %-22s\n", "layer", "forward", "D2H",
              "H2D", "backward");
  const int64_t origin = off->iteration_start_ns;
  for (int i = 0; i < flags.layers; ++i) {
    const LayerTimeline& row = off->timeline[i];
    std::printf("L%-5d %-22s %-22s %-22s %-22s\n", i,
                Cell(row.forward, origin).c_str(),
                Cell(row.d2h, origin).c_str(), Cell(row.h2d, origin).c_str(),
                Cell(row.backward, origin).c_str());
  }

  const double ratio =
      base->step_ns > 0 ? static_cast<double>(off->step_ns) / base->step_ns
                        : 1.0;
  std::printf("\n");
  std::printf("peak device memory, no offloading:  %10.1f MiB\n",
              MiB(base->device.peak_bytes));
  std::printf("peak device memory, %d offloaded:    %10.1f MiB  (first "
              "reached %.1f us into the run)\n",
              flags.offloaded, MiB(off->device.peak_bytes),
              off->device.peak_time_ns / 1e3);
  std::printf("peak pinned memory, %d offloaded:    %10.1f MiB\n",
              flags.offloaded, MiB(off->pinned.peak_bytes));
  std::printf("step time, no offloading:           %10.1f us\n",
              base->step_ns / 1e3);
  std::printf("step time, %d offloaded:             %10.1f us\n",
              flags.offloaded, off->step_ns / 1e3);
  std::printf("step time ratio (offloaded / not):  %10.3f\n", ratio);
  std::printf("offloaded per step:                 %10.1f MiB in %" PRId64
              " spans\n",
              MiB(off->stats.bytes_offloaded / flags.iterations),
              off->stats.spans_offloaded / flags.iterations);

  bool ok = true;
  if (store_bytes) {
    const size_t wrong = base->mismatches.size() + off->mismatches.size();
    std::printf("popped bytes:                       %s (%" PRId64
                " tensors checked)\n",
                wrong == 0 ? "identical" : "WRONG",
                base->tensors_checked + off->tensors_checked);
    for (const auto& m : base->mismatches) std::printf("  %s\n", m.c_str());
    for (const auto& m : off->mismatches) std::printf("  %s\n", m.c_str());
    ok &= wrong == 0;
  } else {
    std::printf("popped bytes:                       not checked (more than "
                "--max_checked_mib=%" PRId64 " MiB: timing only)\n",
                flags.max_checked_mib);
  }
  std::printf("hazards:                            %zu\n",
              base->hazards + off->hazards);
  for (const auto& h : base->hazard_text) std::printf("  %s\n", h.c_str());
  for (const auto& h : off->hazard_text) std::printf("  %s\n", h.c_str());
  ok &= base->hazards + off->hazards == 0;
  for (const std::string& warning : off->warnings) {
    std::printf("engine warning: %s\n", warning.c_str());
  }
  const std::vector<timeline::Timeline> pictures = {base->picture,
                                                    off->picture};
  if (!flags.trace_json.empty()) {
    ok &= WriteFile(flags.trace_json, timeline::ToChromeTraceJson(pictures));
  }
  if (!flags.svg.empty()) {
    ok &= WriteFile(flags.svg, timeline::ToSvg(pictures));
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace offload

int main(int argc, char** argv) {
  // --mode=pipeline: Megatron's fine-grained mode (tools/pipeline_demo.h);
  // --mode=layer (the default): TE's layer mode, below.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mode=pipeline") return offload::RunPipelineDemo(argc, argv);
    if (arg.rfind("--mode", 0) == 0 && arg != "--mode=layer") {
      std::fprintf(stderr, "%s: --mode is layer or pipeline\n%s", argv[i],
                   offload::kUsage);
      return 2;
    }
  }
  offload::Flags flags;
  const offload::FlagParser::Result parsed =
      offload::ParseFlags(argc, argv, flags);
  if (parsed != offload::FlagParser::Result::kOk) {
    return offload::FlagParser::ExitCode(parsed);
  }
  return offload::Run(flags);
}
