#include "bench/offload_sweep.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "bench/gpu_timeline.h"
#include "bench/sim_bound.h"
#include "engine/offload.h"
#include "engine/status.h"

namespace offload::bench {

SweepResult RunSweep(GpuExec& ex, CudaBackend& be, const Flags& flags,
                     double peak_d2h, double peak_h2d) {
  CopyTimer& copies = GlobalCopyTimer();
  SweepResult result;
  std::vector<SweepRow>& rows = result.rows;
  std::vector<uint64_t> reference;
  std::array<double, kGemms>& gemm_ns = result.gemm_ns;

  // k = 0 .. kmax with TE's k-of-n, then each --budget_k with the byte
  // budget (its first warm-up step is the recorded one).
  // Then each --joint_k (the same budget planned with recompute, SPEC
  // §4.8) and each --ckpt_k (recompute only, nothing offloaded).
  struct Config {
    int k;
    double budget_k;
    RowMode mode;
  };
  std::vector<Config> configs;
  for (int k = 0; k <= flags.kmax; ++k) {
    configs.push_back({k, -1, RowMode::kLayers});
  }
  for (double b : flags.budget_k) configs.push_back({-1, b, RowMode::kBudget});
  for (double b : flags.joint_k) configs.push_back({-1, b, RowMode::kJoint});
  for (double b : flags.ckpt_k) {
    configs.push_back({-1, b, RowMode::kCheckpoint});
  }
  for (const Config& config : configs) {
    const int k = config.k;
    Shape s = flags.shape;
    OffloadOptions oo;
    std::string plan_text;
    if (!RowOptions(s, config.mode, config.budget_k, gemm_ns, peak_d2h,
                    peak_h2d, flags.retain, &oo, &plan_text)) {
      continue;
    }
    if (config.mode == RowMode::kLayers) oo.offloaded_layers = k;
    // --probe: the budget counts what the backend's pool counts (SPEC
    // §4.7); the bound's simulator uses its own probe.
    const bool probe = flags.probe && (config.mode == RowMode::kBudget ||
                                       config.mode == RowMode::kJoint);
    if (probe) {
      oo.device_bytes_probe = &be.InUseProbe();
      oo.smallest_budget = true;  // see Flags::probe
    }
    StatusOr<std::unique_ptr<Offloader>> created = Offloader::Create(be, oo);
    if (!created.ok()) {  // e.g. no joint plan fits the budget
      std::fprintf(stderr, "%s k=%g: %s\n", RowModeName(config.mode),
                   config.budget_k, created.status().ToString().c_str());
      continue;
    }
    std::unique_ptr<Offloader> off = std::move(created).value();
    for (int w = 0; w < flags.warmup; ++w) RunStep(ex, *off, s);
    Cuda(cudaDeviceSynchronize(), "sync");
    // Per-GEMM durations, for the bound (k=0), and at every k to see
    // whether the GEMMs run at the same speed next to the copies.
    std::array<double, kGemms> own_ns{};
    {
      std::array<std::vector<double>, kGemms> samples;
      for (int c = 0; c < 3; ++c) {
        ex.StartCalibration();
        RunStep(ex, *off, s);
        ex.EndCalibration(samples);
      }
      for (int g = 0; g < kGemms; ++g) own_ns[g] = Median(samples[g]);
      if (k == 0) gemm_ns = own_ns;
    }
    auto st0 = Must(be.stats(), "stats");
    unsigned long long zero = 0;
    Cuda(cudaMemPoolSetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                                 &zero),
         "reset UsedMemHigh");
    std::vector<double> times, host;
    StepCost cost;
    double call_ns[kCalls] = {};
    int64_t call_count[kCalls] = {};
    int64_t offloaded0 = off->stats().tensors_offloaded;
    for (int i = 0; i < flags.steps; ++i) {
      Cuda(cudaDeviceSynchronize(), "sync");
      Clock::time_point t0 = Clock::now();
      StepCost c = RunStep(ex, *off, s);
      Cuda(cudaDeviceSynchronize(), "sync");
      times.push_back(NsSince(t0));
      host.push_back(c.engine_host_ns);
      cost.pushes += c.pushes;
      for (int q = 0; q < kCalls; ++q) {
        call_ns[q] += c.call_ns[q];
        call_count[q] += c.call_count[q];
      }
    }
    int64_t offloaded = off->stats().tensors_offloaded - offloaded0;
    unsigned long long high = 0;
    Cuda(cudaMemPoolGetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                                 &high),
         "UsedMemHigh");
    auto st1 = Must(be.stats(), "stats");

    // One more step with each engine copy timed, and the outputs checked.
    copies.records.clear();
    copies.next = 0;
    copies.overflow = false;
    copies.enabled = true;
    ex.set_capture(true);
    RunStep(ex, *off, s);
    Cuda(cudaDeviceSynchronize(), "sync");
    copies.enabled = false;
    ex.set_capture(false);
    double d2h_bytes = 0, h2d_bytes = 0, d2h_ms = 0, h2d_ms = 0;
    size_t min_copy = SIZE_MAX;
    for (const CopyRecord& r : copies.records) {
      float ms = 0;
      Cuda(cudaEventElapsedTime(&ms, r.start, r.end), "elapsed");
      (r.d2h ? d2h_bytes : h2d_bytes) += double(r.bytes);
      (r.d2h ? d2h_ms : h2d_ms) += ms;
      min_copy = std::min(min_copy, r.bytes);
    }
    if (copies.overflow) std::printf("warning: copy event pool overflow\n");
    std::vector<uint64_t> hashes = ex.Hashes();
    if (k == 0) reference = hashes;

    SweepRow row{};
    row.k = k;
    row.budget_k = config.budget_k;
    row.mode = config.mode;
    row.probe = probe;
    if (config.budget_k >= 0) {
      row.budget_bytes = BudgetForK(s, config.budget_k);
      if (config.mode == RowMode::kJoint) plan_text = off->JointPlanText();
      std::fprintf(stderr, "%s k=%g plan:\n%s%s", RowModeName(config.mode),
                   config.budget_k, plan_text.c_str(),
                   off->BudgetPlanText().c_str());
    }
    for (int l = 0; l < s.layers; ++l) {
      if (off->Recompute(l) ||
          (l < int(s.checkpointed.size()) && s.checkpointed[l])) {
        ++row.recomputed;
      }
    }
    row.step_ns = Median(times);
    double sum_host = 0;
    for (double h : host) sum_host += h;
    row.host_ns_per_offloaded = offloaded ? sum_host / double(offloaded) : 0;
    row.host_ns_per_push = sum_host / double(cost.pushes);
    row.peak = high;
    row.d2h_bytes = d2h_bytes;
    row.h2d_bytes = h2d_bytes;
    row.d2h_gbps = d2h_ms > 0 ? d2h_bytes / (d2h_ms * 1e6) : 0;
    row.h2d_gbps = h2d_ms > 0 ? h2d_bytes / (h2d_ms * 1e6) : 0;
    row.copies = copies.records.size();
    row.min_copy = copies.records.empty() ? 0 : min_copy;
    row.identical = hashes == reference;
    row.pinned_slab_allocs =
        st1.pinned_slab_allocations - st0.pinned_slab_allocations;
    SimResult sim =
        SimulateSchedule(s, oo, gemm_ns, peak_d2h, peak_h2d, false, probe);
    row.bound_ns = sim.step_ns;
    if (config.mode == RowMode::kJoint) {
      if (StatusOr<JointRowLimit> limit = JointRowLimitOf(oo); limit.ok()) {
        row.plan_ns = limit->plan_ns;
        row.limit_ns = limit->limit_ns;
      }
    }
    row.sim_peak = sim.peak_bytes;
    row.hazards = sim.hazards;
    SimResult sim_own =
        SimulateSchedule(s, oo, own_ns, peak_d2h, peak_h2d, false, probe);
    row.bound_own_ns = sim_own.step_ns;
    for (int g = 0; g < kGemms; ++g) (g < 5 ? row.fwd_ns : row.bwd_ns) += own_ns[g];
    for (int q = 0; q < kCalls; ++q) {
      row.call_us[q] = call_count[q] ? call_ns[q] / call_count[q] / 1e3 : 0;
    }
    rows.push_back(row);
    if (flags.timeline_k >= 0 && (k == 0 || k == flags.timeline_k)) {
      result.timelines.push_back(CaptureStepTimeline(ex, *off, s, k));
    }
    std::fprintf(stderr, "%s k=%g done: step %.2f ms, bound %.2f ms\n",
                 RowModeName(config.mode),
                 k >= 0 ? double(k) : config.budget_k,
                 row.step_ns / 1e6, row.bound_ns / 1e6);
    for (const std::string& w : off->diagnostics().warnings()) {
      std::fprintf(stderr, "  engine warning: %s\n", w.c_str());
    }
  }
  return result;
}

}  // namespace offload::bench
