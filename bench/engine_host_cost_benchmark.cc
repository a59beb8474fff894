// Engine-only host cost per offloaded tensor: ForwardStep + Push + BackwardStep
// + Pop + FinishBackward of a layer stack (driven by RunLayerStep,
// testing/layer_loop.h) on the SimBackend without bytes
// (store_bytes = false, no trace). The figure includes the simulator's own
// bookkeeping of the enqueued operations (its hazard detector too), so it is
// an upper bound for the engine's share; the simulated device's progress
// (RunUntilIdle at the end of each step) is excluded from the timing.
//
//   bazel run -c opt //bench:engine_host_cost_benchmark
//
// Counters: us_per_offloaded = wall time / offloaded tensors (k layers x m
// tensors per step); us_per_push = wall time / all pushes (n x m).

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "testing/layer_loop.h"

namespace offload {
namespace {

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "FATAL: %s\n", s.ToString().c_str());
    std::abort();
  }
}
template <typename T>
T Check(StatusOr<T> s) {
  Check(s.status());
  return std::move(s).value();
}

// Args: layers offloaded k, tensors per layer m (8 layers).
void BM_EngineStep(benchmark::State& state) {
  const int n = 8;
  const int k = int(state.range(0));
  const int m = int(state.range(1));
  const int64_t elements = 4096;  // 8 KiB bf16: size does not matter here
  SimOptions so;
  so.store_bytes = false;
  so.record_trace = false;
  SimBackend sim(so);
  OffloadOptions oo;
  oo.model_layers = n;
  oo.offloaded_layers = k;
  oo.min_offload_elements = 1024;
  auto off = Check(Offloader::Create(sim, oo));
  std::vector<std::vector<SavedTensor>> saved(n);
  auto make = [&] {
    Tensor t;
    t.storage = std::make_shared<Storage>(
        Check(sim.AllocateDevice(elements * 2, sim.ComputeStream())));
    t.dtype = DType::kBF16;
    t.shape = {elements};
    t.strides = {1};
    return t;
  };
  // Tensors are made outside the timed region: only engine calls (and the
  // layer loop's hooks around them) are timed.
  std::vector<std::vector<Tensor>> fresh(n);
  LayerLoopHooks hooks;
  hooks.forward = [&](int i) {
    saved[i].clear();
    for (int j = 0; j < m; ++j) saved[i].push_back(Check(off->Push(fresh[i][j])));
    fresh[i].clear();  // drop the caller's references, as autograd does
    return OkStatus();
  };
  hooks.backward = [&](int i) {
    for (const SavedTensor& st : saved[i]) {
      Tensor t = Check(off->Pop(st));
      benchmark::DoNotOptimize(t.storage);
    }
    saved[i].clear();
    return OkStatus();
  };
  int64_t pushes = 0, offloaded = 0;
  for (auto _ : state) {
    state.PauseTiming();
    sim.RunUntilIdle();
    for (auto& layer : fresh) {
      layer.clear();
      for (int j = 0; j < m; ++j) layer.push_back(make());
    }
    state.ResumeTiming();
    Check(RunLayerStep(*off, n, hooks));
    pushes += int64_t{n} * m;
    offloaded += int64_t{k} * m;
  }
  sim.RunUntilIdle();
  state.counters["us_per_offloaded"] = benchmark::Counter(
      k > 0 ? double(offloaded) / 1e6 : 0.0,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["us_per_push"] = benchmark::Counter(
      double(pushes) / 1e6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_EngineStep)
    ->ArgsProduct({{0, 2, 4, 6}, {5, 32}})
    ->ArgNames({"k", "m"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace offload

BENCHMARK_MAIN();
