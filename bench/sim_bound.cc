#include "bench/sim_bound.h"

#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "bench/bench_util.h"
#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload::bench {
namespace {

// The simulator: the same calls, kernels of the measured durations.

class SimExec final : public Exec {
 public:
  SimExec(SimBackend& sim, const std::array<double, kGemms>& ns)
      : sim_(sim), ns_(ns) {}
  Backend& backend() override { return sim_; }
  void* weight(int) override { return nullptr; }
  void* grad(int, int) override { return nullptr; }
  void* work(int) override { return nullptr; }
  void Run(int id, int, const Gemm&, std::vector<const Tensor*> reads,
           const Tensor* write) override {
    SimKernel k;
    k.name = kGemmNames[id];
    k.duration_ns = int64_t(ns_[id] + 0.5);
    for (const Tensor* t : reads) k.reads.push_back(Range(*t));
    if (write) k.writes.push_back(Range(*write));
    Must(sim_.EnqueueKernel(sim_.ComputeStream(), std::move(k)), "kernel");
  }
  void FillInput(const Tensor& x0) override {
    SimKernel k;
    k.name = "fill input";
    k.writes.push_back(Range(x0));
    Must(sim_.EnqueueKernel(sim_.ComputeStream(), std::move(k)), "kernel");
  }
  void Output(const Tensor&) override {}

 private:
  static SimRange Range(const Tensor& t) {
    return SimRange{t.storage->data(), t.storage->size_bytes()};
  }
  SimBackend& sim_;
  std::array<double, kGemms> ns_;
};

}  // namespace

std::unique_ptr<Exec> NewSimExec(SimBackend& sim,
                                 const std::array<double, kGemms>& ns) {
  return std::make_unique<SimExec>(sim, ns);
}

SimResult SimulateSchedule(const Shape& s, int k,
                           const std::array<double, kGemms>& ns,
                           double d2h_gbps, double h2d_gbps,
                           bool print_trace) {
  return SimulateSchedule(s, BenchOptions(s, k, -1, false), ns, d2h_gbps,
                          h2d_gbps, print_trace);
}

SimResult SimulateSchedule(const Shape& s, const OffloadOptions& oo,
                           const std::array<double, kGemms>& ns,
                           double d2h_gbps, double h2d_gbps,
                           bool print_trace, bool probe) {
  SimOptions so;
  so.d2h_gbps = d2h_gbps;
  so.h2d_gbps = h2d_gbps;
  so.copy_latency_ns = 0;  // a lower bound: the measured peak, no latency
  so.device_capacity_bytes = int64_t{1} << 40;
  so.pinned_capacity_bytes = int64_t{1} << 40;
  so.store_bytes = false;
  so.record_trace = print_trace;
  SimBackend sim(so);
  SimExec ex(sim, ns);
  OffloadOptions options = oo;
  options.device_bytes_probe = probe ? &sim.InUseProbe() : nullptr;
  auto off = Must(Offloader::Create(sim, options), "Offloader::Create (sim)");
  std::vector<double> steps;
  int64_t offloaded_before = 0;
  for (int it = 0; it < 3; ++it) {
    sim.RunUntilIdle();
    // The peak and the bytes of the last step (a byte budget's first step
    // is recorded without offloading).
    sim.ResetPeaks();
    offloaded_before = off->stats().bytes_offloaded;
    int64_t t0 = sim.NowNs();
    RunStep(ex, *off, s);
    sim.RunUntilIdle();
    steps.push_back(double(sim.NowNs() - t0));
  }
  if (print_trace) {
    // The last step's start/end lines of the compute and copy streams.
    for (const SimTraceEntry& e : sim.trace()) {
      if (e.phase == SimPhase::kEnqueue || e.phase == SimPhase::kHost) {
        continue;
      }
      std::printf("%s\n", e.ToString().c_str());
    }
  }
  SimResult r;
  r.step_ns = steps.back();
  r.peak_bytes = sim.device_memory().peak_bytes;
  r.hazards = sim.hazards().size();
  r.bytes_offloaded = off->stats().bytes_offloaded - offloaded_before;
  return r;
}

}  // namespace offload::bench
