// A smoke run of the simulated GPU: a layer stack whose activations are
// copied to pinned memory during forward and back during backward, written
// directly against the Backend interface (the offload engine will replace
// this hand-made schedule). Prints the timeline in virtual time, the peak
// device memory, and checks bytes and hazards.
//
//   bazel run //:demo -- --layers=6 --mib_per_layer=256 --compute_us=4000

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"

namespace offload {
namespace {

struct Flags {
  int layers = 6;
  int64_t mib_per_layer = 256;
  int64_t compute_us = 4000;
  double gbps = 55.0;
  uint64_t seed = 1;
};

bool ParseFlags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("layers")) {
      flags.layers = std::atoi(v);
    } else if (const char* v = value("mib_per_layer")) {
      flags.mib_per_layer = std::atoll(v);
    } else if (const char* v = value("compute_us")) {
      flags.compute_us = std::atoll(v);
    } else if (const char* v = value("gbps")) {
      flags.gbps = std::atof(v);
    } else if (const char* v = value("seed")) {
      flags.seed = std::strtoull(v, nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "unknown flag %s\nflags: --layers --mib_per_layer "
                   "--compute_us --gbps --seed\n",
                   argv[i]);
      return false;
    }
  }
  return flags.layers > 0 && flags.mib_per_layer > 0 && flags.compute_us >= 0 &&
         flags.gbps > 0;
}

#define DEMO_CHECK_OK(expr)                                           \
  do {                                                                \
    ::offload::Status demo_status_ = (expr);                          \
    if (!demo_status_.ok()) {                                         \
      std::fprintf(stderr, "%s\n", demo_status_.ToString().c_str());  \
      std::exit(1);                                                   \
    }                                                                 \
  } while (false)

template <typename T>
T Value(StatusOr<T> status_or) {
  DEMO_CHECK_OK(status_or.status());
  return std::move(status_or).value();
}

// Start and end of the stream operation with sequence number `op`.
std::pair<int64_t, int64_t> Span(const SimBackend& sim, uint64_t op) {
  int64_t start = -1, end = -1;
  for (const SimTraceEntry& entry : sim.trace()) {
    if (entry.op != op) continue;
    if (entry.phase == "start") start = entry.time_ns;
    if (entry.phase == "end") end = entry.time_ns;
  }
  return {start, end};
}

uint64_t LastOp(const SimBackend& sim) { return sim.trace().back().op; }

int Run(const Flags& flags) {
  SimOptions options;
  options.seed = flags.seed;
  options.d2h_gbps = options.h2d_gbps = flags.gbps;
  std::unique_ptr<SimBackend> sim = NewSimBackend(options);
  Stream& compute = sim->ComputeStream();
  Stream* d2h = Value(sim->NewStream("d2h"));
  Stream* h2d = Value(sim->NewStream("h2d"));
  const int64_t bytes = flags.mib_per_layer << 20;
  const int64_t compute_ns = flags.compute_us * 1000;
  const int n = flags.layers;

  struct Layer {
    Buffer activation, host;
    std::unique_ptr<Event> produced, offloaded, reloaded;
    uint64_t fwd = 0, bwd = 0, offload = 0, reload = 0;
  };
  std::vector<Layer> layers(n);

  // Forward: each layer writes its activation; the D2H stream copies it out
  // once written; the compute stream frees it once the copy is done.
  for (int i = 0; i < n; ++i) {
    Layer& layer = layers[i];
    layer.produced = Value(sim->NewEvent());
    layer.offloaded = Value(sim->NewEvent());
    layer.reloaded = Value(sim->NewEvent());
    layer.activation = Value(sim->AllocateDevice(bytes, compute));
    layer.host = Value(sim->AllocatePinned(bytes));
    void* data = layer.activation.data();
    SimKernel forward{"forward L" + std::to_string(i), compute_ns, {},
                      {{data, bytes}},
                      [data, bytes, i](SimBackend& s) {
                        std::memset(*s.MutableBytes(data, bytes), 'A' + i,
                                    bytes);
                      }};
    DEMO_CHECK_OK(sim->EnqueueKernel(compute, std::move(forward)));
    layer.fwd = LastOp(*sim);
    DEMO_CHECK_OK(compute.Record(*layer.produced));
    DEMO_CHECK_OK(d2h->Wait(*layer.produced));
    DEMO_CHECK_OK(d2h->Copy(layer.host.data(), data, bytes));
    layer.offload = LastOp(*sim);
    DEMO_CHECK_OK(d2h->Record(*layer.offloaded));
    // Release before the forward of layer i+2: one layer of slack.
    if (i >= 1) {
      Layer& old = layers[i - 1];
      DEMO_CHECK_OK(compute.Wait(*old.offloaded));
      DEMO_CHECK_OK(sim->Free(old.activation, compute));
    }
  }
  DEMO_CHECK_OK(compute.Wait(*layers[n - 1].offloaded));
  DEMO_CHECK_OK(sim->Free(layers[n - 1].activation, compute));

  // Backward in reverse: reload layer i one step ahead, then "use" it.
  auto reload = [&](int i) {
    Layer& layer = layers[i];
    layer.activation = Value(sim->AllocateDevice(bytes, compute));
    DEMO_CHECK_OK(compute.Record(*layer.produced));  // allocation point
    DEMO_CHECK_OK(h2d->Wait(*layer.produced));
    DEMO_CHECK_OK(h2d->Copy(layer.activation.data(), layer.host.data(), bytes));
    layer.reload = LastOp(*sim);
    DEMO_CHECK_OK(h2d->Record(*layer.reloaded));
  };
  reload(n - 1);
  bool bytes_ok = true;
  std::vector<Buffer> checks;
  for (int i = n - 1; i >= 0; --i) {
    if (i > 0) reload(i - 1);
    Layer& layer = layers[i];
    DEMO_CHECK_OK(compute.Wait(*layer.reloaded));
    SimKernel backward{"backward L" + std::to_string(i), 2 * compute_ns,
                       {{layer.activation.data(), bytes}}, {}, nullptr};
    DEMO_CHECK_OK(sim->EnqueueKernel(compute, std::move(backward)));
    layer.bwd = LastOp(*sim);
    // Check the reloaded bytes: copy the first KiB back to the host.
    checks.push_back(Value(sim->AllocatePinned(1024)));
    DEMO_CHECK_OK(compute.Copy(checks.back().data(), layer.activation.data(),
                               1024));
    DEMO_CHECK_OK(sim->Free(layer.activation, compute));
  }
  sim->RunUntilIdle();
  for (int i = n - 1, k = 0; i >= 0; --i, ++k) {
    const auto* got = static_cast<const uint8_t*>(checks[k].data());
    for (int b = 0; b < 1024; ++b) bytes_ok &= got[b] == 'A' + i;
  }

  std::printf("simulated GPU smoke run: %d layers x %lld MiB, compute %lld us "
              "forward / %lld us backward, copies %.1f GB/s\n\n",
              n, static_cast<long long>(flags.mib_per_layer),
              static_cast<long long>(flags.compute_us),
              static_cast<long long>(2 * flags.compute_us), flags.gbps);
  std::printf("%-6s %21s %21s %21s %21s\n", "layer", "forward (us)",
              "D2H (us)", "H2D (us)", "backward (us)");
  for (int i = 0; i < n; ++i) {
    auto cell = [&](uint64_t op) {
      auto [start, end] = Span(*sim, op);
      char text[32];
      std::snprintf(text, sizeof(text), "%9.1f..%-9.1f", start / 1e3,
                    end / 1e3);
      return std::string(text);
    };
    std::printf("L%-5d %21s %21s %21s %21s\n", i, cell(layers[i].fwd).c_str(),
                cell(layers[i].offload).c_str(), cell(layers[i].reload).c_str(),
                cell(layers[i].bwd).c_str());
  }
  SimMemoryStats device = sim->device_memory();
  std::printf("\nstep time           %.1f us\n", sim->NowNs() / 1e3);
  std::printf("peak device memory  %.1f MiB at t=%.1f us (all %d layers "
              "resident would be %lld MiB)\n",
              device.peak_bytes / 1048576.0, device.peak_time_ns / 1e3, n,
              static_cast<long long>(n * flags.mib_per_layer));
  std::printf("reloaded bytes      %s\n", bytes_ok ? "identical" : "WRONG");
  std::printf("hazards             %zu\n", sim->hazards().size());
  for (const Hazard& hazard : sim->hazards()) {
    std::printf("  %s\n", hazard.ToString().c_str());
  }
  return bytes_ok && sim->hazards().empty() ? 0 : 1;
}

}  // namespace
}  // namespace offload

int main(int argc, char** argv) {
  offload::Flags flags;
  if (!offload::ParseFlags(argc, argv, flags)) return 2;
  return offload::Run(flags);
}
