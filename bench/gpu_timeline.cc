#include "bench/gpu_timeline.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "timeline/svg_timeline.h"
#include "timeline/trace_json.h"

namespace offload::bench {
namespace {

using timeline::Slice;
using timeline::SliceKind;
using timeline::Timeline;

// A gap between two GEMMs at least this long is drawn as "compute idle".
constexpr int64_t kIdleNs = 50'000;

// Nanoseconds from `origin` to `e` (both recorded and complete).
int64_t At(cudaEvent_t origin, cudaEvent_t e) {
  float ms = 0;
  Cuda(cudaEventElapsedTime(&ms, origin, e), "cudaEventElapsedTime");
  return static_cast<int64_t>(double(ms) * 1e6 + 0.5);
}

std::string Fixed(double value, const char* format = "%.2f") {
  char text[32];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

// The layer of each copy of one direction, from their order and sizes:
// offloads go layer 0, 1, ..., k-1, reloads k-1, ..., 0, each layer's
// `per_layer` bytes in full. Empty when the copies do not add up to that.
std::vector<int> LayersByOrder(const std::vector<size_t>& bytes, int k,
                               int64_t per_layer, bool reverse) {
  std::vector<int> layers;
  int64_t done = 0;
  for (size_t b : bytes) {
    const int64_t first = done / per_layer;
    const int64_t last = (done + int64_t(b) - 1) / per_layer;
    if (first != last || first >= k) return {};
    layers.push_back(reverse ? k - 1 - int(first) : int(first));
    done += int64_t(b);
  }
  if (done != int64_t(k) * per_layer) return {};
  return layers;
}

// Time in [start, end) during which one of `busy` (sorted, disjoint) runs.
int64_t Overlap(const std::vector<std::pair<int64_t, int64_t>>& busy,
                int64_t start, int64_t end) {
  int64_t sum = 0;
  for (const auto& [b0, b1] : busy) {
    sum += std::max<int64_t>(0, std::min(end, b1) - std::max(start, b0));
  }
  return sum;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  const bool ok = file != nullptr &&
                  std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const bool closed = file != nullptr && std::fclose(file) == 0;
  if (!ok || !closed) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return true;
}

}  // namespace

Timeline CaptureStepTimeline(GpuExec& ex, Offloader& off, const Shape& s,
                             int k) {
  CudaBackend& be = static_cast<CudaBackend&>(ex.backend());
  CopyTimer& copies = GlobalCopyTimer();
  cudaEvent_t origin = nullptr;
  Cuda(cudaEventCreate(&origin), "cudaEventCreate origin");
  // One untimed step first: the check before this leaves the GEMMs idle
  // while it copies the gradients to the host, and a GPU that was idle runs
  // its first GEMMs at a higher clock than under sustained load (power cap).
  RunStep(ex, off, s);
  Cuda(cudaDeviceSynchronize(), "sync");
  const int64_t bytes_before = Must(be.stats(), "stats").device_bytes_in_use;

  copies.records.clear();
  copies.next = 0;
  copies.overflow = false;
  copies.enabled = true;
  ex.set_sample_device_bytes(true);
  ex.StartCalibration();
  Cuda(cudaEventRecord(origin, ex.stream()), "record origin");
  RunStep(ex, off, s);
  std::array<std::vector<double>, kGemms> unused;
  ex.EndCalibration(unused);  // synchronizes the device
  copies.enabled = false;
  ex.set_sample_device_bytes(false);
  const int64_t bytes_after = Must(be.stats(), "stats").device_bytes_in_use;
  if (copies.overflow) {
    std::fprintf(stderr, "warning: timeline k=%d: copy event pool overflow\n",
                 k);
  }

  Timeline t;
  const std::string shape = "hidden " + std::to_string(s.hidden) + ", " +
                            std::to_string(s.tokens) + " tokens: ";
  t.title = shape + (k == 0 ? std::string("no offloading")
                            : std::to_string(k) + " of " +
                                  std::to_string(s.layers) +
                                  " layers offloaded");
  t.tracks = {"compute", "offload_d2h", "offload_h2d"};
  const int64_t per_layer = s.tokens * s.hidden * 2 * 10;  // x,qkv,attn,o,u
  if (k > 0) {
    t.budget_bytes = int64_t(s.layers - k) * per_layer;
    t.budget_label = "n - k = " + std::to_string(s.layers - k) +
                     " layers' saved bytes";
  }

  // The GEMMs, the gaps between them, and the memory samples.
  std::vector<std::pair<int64_t, int64_t>> busy;
  std::vector<timeline::CounterPoint>& memory =
      t.counters[timeline::kDeviceBytes];
  memory.push_back({0, bytes_before});
  for (const GpuExec::TimedGemm& g : ex.LastCalibration()) {
    Slice slice;
    slice.track = "compute";
    slice.kind = g.id < 5 ? SliceKind::kForward : SliceKind::kBackward;
    slice.label = "L" + std::to_string(g.layer);
    slice.name = std::string(kGemmNames[g.id]) + " " + slice.label;
    slice.start_ns = At(origin, g.start);
    slice.end_ns = At(origin, g.end);
    slice.args["gemm"] = kGemmNames[g.id];
    slice.args["layer"] = std::to_string(g.layer);
    if (!busy.empty() && slice.start_ns - busy.back().second >= kIdleNs) {
      const int64_t from = busy.back().second;
      t.slices.push_back(Slice{
          "compute", "compute idle", SliceKind::kStall, from, slice.start_ns,
          "", {{"idle us", Fixed((slice.start_ns - from) / 1e3, "%.1f")}}});
    }
    busy.emplace_back(slice.start_ns, slice.end_ns);
    if (g.device_bytes >= 0) memory.push_back({slice.start_ns, g.device_bytes});
    t.slices.push_back(std::move(slice));
  }

  // The engine's copies, in enqueue order per direction.
  std::vector<const CopyRecord*> dir[2];  // 0: d2h, 1: h2d
  for (const CopyRecord& r : copies.records) dir[r.d2h ? 0 : 1].push_back(&r);
  for (int d = 0; d < 2; ++d) {
    std::vector<size_t> sizes;
    for (const CopyRecord* r : dir[d]) sizes.push_back(r->bytes);
    const std::vector<int> layers =
        LayersByOrder(sizes, k, per_layer, /*reverse=*/d == 1);
    for (size_t i = 0; i < dir[d].size(); ++i) {
      const CopyRecord& r = *dir[d][i];
      Slice slice;
      slice.track = d == 0 ? "offload_d2h" : "offload_h2d";
      slice.kind = d == 0 ? SliceKind::kD2H : SliceKind::kH2D;
      slice.name = d == 0 ? "d2h" : "h2d";
      slice.start_ns = At(origin, r.start);
      slice.end_ns = At(origin, r.end);
      const int64_t ns = slice.end_ns - slice.start_ns;
      slice.args["bytes"] = std::to_string(r.bytes);
      slice.args["GB/s"] = Fixed(ns > 0 ? double(r.bytes) / ns : 0.0);
      if (!layers.empty()) {
        slice.label = "L" + std::to_string(layers[i]);
        slice.name += " " + slice.label;
        slice.args["layer"] = std::to_string(layers[i]);
      }
      t.slices.push_back(std::move(slice));
    }
  }
  memory.push_back({t.EndNs(), bytes_after});
  Cuda(cudaEventDestroy(origin), "cudaEventDestroy origin");
  return t;
}

void PrintTimelineSummary(const std::vector<Timeline>& timelines) {
  std::printf("\n## Timeline of one step (GPU event times)\n\n");
  std::printf("| run | step ms | GEMMs ms | compute idle ms (gaps >= 50 us) "
              "| D2H ms | of it beside a GEMM | H2D ms | of it beside a GEMM "
              "| device bytes peak GiB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Timeline& t : timelines) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    double gemm = 0, idle = 0, copy[2] = {0, 0}, beside[2] = {0, 0};
    for (const Slice& s : t.slices) {
      if (s.kind == SliceKind::kForward || s.kind == SliceKind::kBackward) {
        busy.emplace_back(s.start_ns, s.end_ns);
        gemm += s.end_ns - s.start_ns;
      } else if (s.kind == SliceKind::kStall) {
        idle += s.end_ns - s.start_ns;
      }
    }
    for (const Slice& s : t.slices) {
      if (s.kind != SliceKind::kD2H && s.kind != SliceKind::kH2D) continue;
      const int d = s.kind == SliceKind::kD2H ? 0 : 1;
      copy[d] += s.end_ns - s.start_ns;
      beside[d] += Overlap(busy, s.start_ns, s.end_ns);
    }
    int64_t peak = 0;
    auto memory = t.counters.find(timeline::kDeviceBytes);
    if (memory != t.counters.end()) {
      for (const timeline::CounterPoint& p : memory->second) {
        peak = std::max(peak, p.value);
      }
    }
    auto share = [](double part, double whole) {
      return whole > 0 ? Fixed(100 * part / whole, "%.1f%%") : std::string("–");
    };
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %s | %.2f | %s | %.2f |\n",
                t.title.c_str(), (t.EndNs() - t.origin_ns) / 1e6, gemm / 1e6,
                idle / 1e6, copy[0] / 1e6, share(beside[0], copy[0]).c_str(),
                copy[1] / 1e6, share(beside[1], copy[1]).c_str(), GiB(peak));
  }
}

bool WriteTimelines(const std::vector<Timeline>& timelines,
                    const std::string& prefix) {
  timeline::SvgOptions options;
  options.width = 2000;  // ~120 GEMMs and up to 60 copies per panel
  const bool json = WriteFile(prefix + ".json",
                              timeline::ToChromeTraceJson(timelines));
  const bool svg = WriteFile(prefix + ".svg", timeline::ToSvg(timelines, options));
  return json && svg;
}

}  // namespace offload::bench
