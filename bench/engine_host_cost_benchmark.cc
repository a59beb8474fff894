// Engine-only host cost per offloaded tensor: ForwardStep + Push + BackwardStep
// + Pop + FinishBackward of a layer stack (driven by RunLayerStep,
// workload/layer_loop.h; 8 layers, m saved tensors of their own storage per
// layer, k offloaded by the default schedule; pops in the reverse order of
// the pushes, as autograd and bench/layer_stack.cc do).
//
//   bazel run -c opt //bench:engine_host_cost_benchmark
//
// Three benchmarks of the same step:
//  - BM_EngineStep: on the SimBackend without bytes (store_bytes = false, no
//    trace). Includes the simulator's own bookkeeping of the enqueued work
//    (its hazard detector too); the simulated device's progress
//    (RunUntilIdle between steps) is excluded.
//  - BM_EngineOnly: on a NullBackend (bench/null_backend.h), whose calls do
//    nothing: the engine's own host cost. BM_EngineStep minus BM_EngineOnly
//    is the simulator's share.
//  - BM_EngineMarginal: the same on the NullBackend, minus a step that
//    offloads nothing: the engine's cost per offloaded tensor without the
//    fixed costs of each step (manual time: the difference of the time
//    inside Offloader calls); with evict_kib > 0 the caller evicts the
//    caches before every call, as a framework's host work does.
//  - BM_EngineCalls: on a CountingBackend over the SimBackend: the backend
//    calls the engine makes per offloaded tensor in steady state (after two
//    warm-up steps), by kind. The caller's own calls (making the tensors,
//    dropping its references) are not counted. Third argument: retain
//    (retain_pinned_buffers).
//
// Counters: us_per_offloaded = wall time / offloaded tensors (k layers x m
// tensors per step); us_per_push = wall time / all pushes (n x m); in
// BM_EngineCalls, <Kind> = calls of that kind / offloaded tensors and
// calls = all of them.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/counting/counting_backend.h"
#include "backends/sim/sim_backend.h"
#include "bench/null_backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "workload/layer_loop.h"

namespace offload {
namespace {

constexpr int kLayers = 8;

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

// One layer stack on `backend`: its step, with the tensors made beforehand.
class Stack {
 public:
  // `around_caller` is called before and after each piece of the caller's
  // own work inside the step (dropping its references), so that a counter
  // can leave it out; may be empty.
  Stack(Backend& backend, int k, int m, bool retain,
        std::function<void(bool before)> around_caller = nullptr)
      : backend_(backend), m_(m), around_caller_(std::move(around_caller)),
        saved_(kLayers), fresh_(kLayers) {
    OffloadOptions oo;
    oo.model_layers = kLayers;
    oo.offloaded_layers = k;
    oo.min_offload_elements = 1024;
    oo.retain_pinned_buffers = retain;
    offloader_ = Check(Offloader::Create(backend, oo));
    hooks_.forward = [this](int i) {
      saved_[i].clear();
      for (int j = 0; j < m_; ++j) {
        BeforeEngine();
        const auto t0 = std::chrono::steady_clock::now();
        StatusOr<SavedTensor> h = offloader_->Push(fresh_[i][j]);
        engine_time_ += std::chrono::steady_clock::now() - t0;
        saved_[i].push_back(Check(std::move(h)));
      }
      Caller(true);
      fresh_[i].clear();  // drop the caller's references, as autograd does
      Caller(false);
      return OkStatus();
    };
    hooks_.backward = [this](int i) {
      for (int j = m_ - 1; j >= 0; --j) {
        BeforeEngine();
        const auto t0 = std::chrono::steady_clock::now();
        StatusOr<Tensor> popped = offloader_->Pop(saved_[i][j]);
        engine_time_ += std::chrono::steady_clock::now() - t0;
        Tensor t = Check(std::move(popped));
        benchmark::DoNotOptimize(t.storage);
        Caller(true);
        t = Tensor();
        Caller(false);
      }
      Caller(true);
      saved_[i].clear();
      Caller(false);
      return OkStatus();
    };
    hooks_.before_call = [this](LayerCall, int) { BeforeEngine(); };
    hooks_.timed = [this](LayerCall, int,
                          std::chrono::steady_clock::duration took) {
      engine_time_ += took;
    };
  }

  // Called on the host before every Offloader call (not timed), e.g. to
  // evict the caches as a framework's own work between the calls does.
  void set_before_engine(std::function<void()> f) { before_engine_ = std::move(f); }
  // The wall time spent inside Offloader calls so far.
  std::chrono::steady_clock::duration engine_time() const { return engine_time_; }

  // Makes the next step's tensors (not timed, not counted).
  void MakeTensors() {
    for (auto& layer : fresh_) {
      layer.clear();
      for (int j = 0; j < m_; ++j) {
        Tensor t;
        t.storage = std::make_shared<Storage>(Check(
            backend_.AllocateDevice(kElements * 2, backend_.ComputeStream())));
        t.dtype = DType::kBF16;
        t.shape = {kElements};
        t.strides = {1};
        layer.push_back(std::move(t));
      }
    }
  }

  void Step() { Check(RunLayerStep(*offloader_, kLayers, hooks_)); }

 private:
  static constexpr int64_t kElements = 4096;  // 8 KiB bf16: size is moot
  void Caller(bool before) {
    if (around_caller_) around_caller_(before);
  }
  void BeforeEngine() {
    if (before_engine_) before_engine_();
  }

  Backend& backend_;
  const int m_;
  std::function<void(bool)> around_caller_;
  std::function<void()> before_engine_;
  std::chrono::steady_clock::duration engine_time_{};
  std::unique_ptr<Offloader> offloader_;
  LayerLoopHooks hooks_;
  std::vector<std::vector<SavedTensor>> saved_;
  std::vector<std::vector<Tensor>> fresh_;
};

void SetTimeCounters(benchmark::State& state, int64_t steps) {
  const int k = int(state.range(0));
  const int m = int(state.range(1));
  const double offloaded = double(steps) * k * m;
  const double pushes = double(steps) * kLayers * m;
  state.counters["us_per_offloaded"] = benchmark::Counter(
      k > 0 ? offloaded / 1e6 : 0.0,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["us_per_push"] = benchmark::Counter(
      pushes / 1e6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Args: layers offloaded k, tensors per layer m (8 layers).
void BM_EngineStep(benchmark::State& state) {
  SimOptions so;
  so.store_bytes = false;
  so.record_trace = false;
  SimBackend sim(so);
  Stack stack(sim, int(state.range(0)), int(state.range(1)), false);
  int64_t steps = 0;
  for (auto _ : state) {
    state.PauseTiming();
    sim.RunUntilIdle();
    stack.MakeTensors();
    state.ResumeTiming();
    stack.Step();
    ++steps;
  }
  sim.RunUntilIdle();
  SetTimeCounters(state, steps);
}
BENCHMARK(BM_EngineStep)
    ->ArgsProduct({{0, 2, 4, 6}, {5, 32}})
    ->ArgNames({"k", "m"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_EngineOnly(benchmark::State& state) {
  NullBackend null;
  Stack stack(null, int(state.range(0)), int(state.range(1)), false);
  int64_t steps = 0;
  for (auto _ : state) {
    state.PauseTiming();
    stack.MakeTensors();
    state.ResumeTiming();
    stack.Step();
    ++steps;
  }
  SetTimeCounters(state, steps);
}
BENCHMARK(BM_EngineOnly)
    ->ArgsProduct({{0, 2, 4, 6}, {5, 32}})
    ->ArgNames({"k", "m"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The engine's marginal cost of offloading a tensor (issue 11 item 4's
// "engine-only" figure without each step's fixed costs): each iteration
// runs one step of k offloaded layers and one of none, both on a
// NullBackend, and counts only the time inside Offloader calls; the
// iteration time is the difference, and us_per_offloaded = that difference
// / (k x m). Before every Offloader call the caller writes `evict_kib` KiB
// of its own memory (not timed), as a framework's host work between the
// calls (cuBLAS launches, autograd) does on a GPU machine; 32 MiB evicts
// this machine's L3, so the engine runs from DRAM. Manual time, so the two
// steps alternate under the same machine load. Args: k, m, evict KiB.
void BM_EngineMarginal(benchmark::State& state) {
  const int k = int(state.range(0));
  const int m = int(state.range(1));
  std::vector<char> junk(size_t(state.range(2)) * 1024 + 64);
  char salt = 0;
  auto evict = [&] {
    ++salt;
    for (size_t i = 0; i + 64 <= junk.size(); i += 64) junk[i] = salt;
    benchmark::ClobberMemory();
  };
  NullBackend null;
  Stack offloading(null, k, m, false);
  Stack plain(null, 0, m, false);
  if (state.range(2) > 0) {
    offloading.set_before_engine(evict);
    plain.set_before_engine(evict);
  }
  int64_t steps = 0;
  for (auto _ : state) {
    offloading.MakeTensors();
    plain.MakeTensors();
    const auto a0 = offloading.engine_time();
    offloading.Step();
    const auto b0 = plain.engine_time();
    plain.Step();
    const double diff = std::chrono::duration<double>(
                            (offloading.engine_time() - a0) -
                            (plain.engine_time() - b0))
                            .count();
    state.SetIterationTime(diff > 0 ? diff : 1e-12);
    ++steps;
  }
  state.counters["us_per_offloaded"] = benchmark::Counter(
      double(steps) * k * m / 1e6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_EngineMarginal)
    ->ArgsProduct({{2, 4, 6}, {5, 32}, {0}})
    ->ArgNames({"k", "m", "evict_kib"})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();
// Cold caches: fixed iterations (each evicts before ~100 calls per step).
BENCHMARK(BM_EngineMarginal)
    ->ArgsProduct({{4, 6}, {5}, {4096, 32768}})
    ->ArgNames({"k", "m", "evict_kib"})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(40);

// Args: k, m, retain (0 or 1).
void BM_EngineCalls(benchmark::State& state) {
  const int k = int(state.range(0));
  const int m = int(state.range(1));
  SimOptions so;
  so.store_bytes = false;
  so.record_trace = false;
  SimBackend sim(so);
  CountingBackend counting(sim);
  CallCounts caller, mark;
  Stack stack(counting, k, m, state.range(2) != 0, [&](bool before) {
    if (before) {
      mark = counting.counts();
    } else {
      caller += counting.counts() - mark;
    }
  });
  for (int warm = 0; warm < 2; ++warm) {
    stack.MakeTensors();
    stack.Step();
    sim.RunUntilIdle();
  }
  CallCounts engine;
  int64_t steps = 0;
  for (auto _ : state) {
    sim.RunUntilIdle();
    stack.MakeTensors();
    counting.Reset();
    caller = CallCounts();
    stack.Step();
    engine += counting.counts() - caller;
    ++steps;
  }
  sim.RunUntilIdle();
  const double offloaded = double(steps) * k * m;
  const std::vector<std::string> names = CallCounts::Names();
  const std::vector<int64_t> values = engine.Values();
  for (size_t i = 0; i < names.size(); ++i) {
    state.counters[names[i]] = offloaded > 0 ? values[i] / offloaded : 0.0;
  }
  state.counters["calls"] = offloaded > 0 ? engine.total() / offloaded : 0.0;
}
BENCHMARK(BM_EngineCalls)
    ->ArgsProduct({{2, 4, 6}, {5}, {0, 1}})
    ->ArgNames({"k", "m", "retain"})
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(20);

}  // namespace
}  // namespace offload

BENCHMARK_MAIN();
