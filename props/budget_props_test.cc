// SPEC §6 with a byte budget (§4.7): over random stacks — layers, tensor
// sizes, views pushed twice, small kept tensors, kernel times, copy speeds,
// jitter, budgets — run in autograd's order on the simulator, the device
// bytes of offloadable saved tensors never exceed the budget once the plan
// is made, every popped byte is what was pushed, there is no hazard and no
// leak, and a run is deterministic.
//
// The driver here follows the plan's model (engine/plan/budget_plan.h):
// each saved tensor is allocated, written by a kernel that reads the
// previous one (then dropped), and pushed; so device memory in this program
// is exactly the saved tensors.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "workload/sim_compute.h"
#include "workload/tensor_util.h"
#include "workload/workload.h"

namespace offload {
namespace {

constexpr int64_t kCols = 32;              // bf16: 64 bytes per row
constexpr int64_t kMinOffloadElements = 256;

struct SavedSpec {
  int64_t rows = 16;    // rows * kCols < kMinOffloadElements: kept
  bool twice = false;   // pushed a second time (a view of one storage)
  int64_t kernel_ns = 0;
};

struct BudgetCase {
  std::vector<std::vector<SavedSpec>> layers;
  SimOptions sim;
  int iterations = 3;
  // Of the offloadable bytes of one step above the largest layer's: under
  // that a layer-by-layer backward (SPEC §4.5) cannot fit.
  double budget_fraction = 1.0;
  bool retain = false;
  // The driver keeps a layer's tensors until the layer ends (a module's
  // locals), as the layer benchmark does, instead of dropping each once
  // its reader is enqueued.
  bool hold_layer = false;
  // SPEC §4.7 with a probe: the Offloader gets the simulator's probe, and
  // (when output_rows > 0) the stack makes device memory the engine never
  // sees: an output of output_rows rows after the forward, held until the
  // last layer's backward ends, and per layer's backward a gradient of that
  // size, held until the next one's exists.
  bool probe = false;
  int64_t output_rows = 0;

  int64_t OffloadableBytes() const {
    int64_t total = 0;
    for (const auto& layer : layers) {
      for (const SavedSpec& s : layer) {
        if (s.rows * kCols >= kMinOffloadElements) total += s.rows * kCols * 2;
      }
    }
    return total;
  }
  int64_t KeptBytes() const {
    int64_t total = 0;
    for (const auto& layer : layers) {
      for (const SavedSpec& s : layer) {
        if (s.rows * kCols < kMinOffloadElements) total += s.rows * kCols * 2;
      }
    }
    return total;
  }
  int64_t LargestLayerBytes() const {
    int64_t largest = 0;
    for (const auto& layer : layers) {
      int64_t bytes = 0;
      for (const SavedSpec& s : layer) {
        if (s.rows * kCols >= kMinOffloadElements) bytes += s.rows * kCols * 2;
      }
      largest = std::max(largest, bytes);
    }
    return largest;
  }
  int64_t Budget() const {
    const int64_t floor = std::max<int64_t>(1, LargestLayerBytes());
    const int64_t above = std::max<int64_t>(0, OffloadableBytes() - floor);
    return floor + static_cast<int64_t>(budget_fraction * double(above));
  }
};

rc::Gen<BudgetCase> GenCase() {
  return rc::gen::exec([] {
    BudgetCase c;
    const int layers = *rc::gen::inRange(1, 7);
    for (int l = 0; l < layers; ++l) {
      std::vector<SavedSpec> layer(*rc::gen::inRange(1, 6));
      for (SavedSpec& s : layer) {
        s.rows = *rc::gen::element<int64_t>(4, 8, 16, 32, 64, 96);
        s.twice = *rc::gen::inRange(0, 5) == 0;
        s.kernel_ns = *rc::gen::inRange<int64_t>(0, 20'001);
      }
      c.layers.push_back(layer);
    }
    c.sim.seed = *rc::gen::arbitrary<uint64_t>();
    c.sim.d2h_gbps = *rc::gen::element(0.05, 0.5, 5.0, 55.0);
    c.sim.h2d_gbps = *rc::gen::element(0.05, 0.5, 5.0, 55.0);
    c.sim.copy_latency_ns = *rc::gen::inRange<int64_t>(0, 3000);
    c.sim.duration_jitter = *rc::gen::element(0.0, 0.0, 0.3);
    c.iterations = *rc::gen::inRange(2, 5);
    c.budget_fraction = *rc::gen::element(0.0, 0.1, 0.25, 0.5, 0.75, 1.0);
    c.retain = *rc::gen::arbitrary<bool>();
    c.hold_layer = *rc::gen::arbitrary<bool>();
    return c;
  });
}

struct BudgetRun {
  Status status;                 // the first engine or driver error
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<Offloader> offloader;
  std::vector<int64_t> peaks;    // device high-water mark per iteration
  int mismatches = 0;
  bool planned = false;          // a plan was made after iteration 1
};

#define BUDGET_TRY(expr)                         \
  do {                                           \
    Status status_ = (expr);                     \
    if (!status_.ok()) return status_;           \
  } while (0)

Status RunIterations(const BudgetCase& c, BudgetRun& run) {
  SimBackend& sim = *run.sim;
  Offloader& off = *run.offloader;
  const MakeTensorFn make = SimMakeTensor(sim);
  const CaptureFn capture = SimCapture(sim);
  const ComputeFn compute = SimCompute(sim);
  const int n = static_cast<int>(c.layers.size());
  for (int it = 0; it < c.iterations; ++it) {
    sim.ResetPeaks();
    std::vector<std::vector<std::vector<SavedTensor>>> saved(n);
    std::vector<std::vector<uint64_t>> seeds(n);
    std::optional<Tensor> previous;
    for (int l = 0; l < n; ++l) {
      StatusOr<int> layer = off.ForwardStep();
      if (!layer.ok()) return layer.status();
      std::vector<Tensor> held;  // hold_layer: until the layer ends
      for (size_t t = 0; t < c.layers[l].size(); ++t) {
        const SavedSpec& s = c.layers[l][t];
        const uint64_t seed = (uint64_t(it) << 32) | (uint64_t(l) << 16) | t;
        StatusOr<Tensor> tensor =
            make(sim, DType::kBF16, {s.rows, kCols}, seed);
        if (!tensor.ok()) return tensor.status();
        std::vector<const Tensor*> reads;
        if (previous.has_value()) reads.push_back(&*previous);
        BUDGET_TRY(compute(sim.ComputeStream(),
                           ComputeCall{"fwd", s.kernel_ns, reads, {&*tensor}}));
        if (c.hold_layer && previous.has_value()) held.push_back(*previous);
        previous.reset();  // its reader is enqueued: dropped before the push
        std::vector<SavedTensor> handles;
        for (int k = 0; k < (s.twice ? 2 : 1); ++k) {
          StatusOr<SavedTensor> h = off.Push(*tensor);
          if (!h.ok()) return h.status();
          handles.push_back(*h);
        }
        saved[l].push_back(std::move(handles));
        seeds[l].push_back(seed);
        previous = std::move(*tensor);
      }
    }
    std::optional<Tensor> output, grad;  // never pushed (output_rows > 0)
    auto outside = [&](const char* name) -> StatusOr<Tensor> {
      OFFLOAD_ASSIGN_OR_RETURN(
          Tensor t, make(sim, DType::kBF16, {c.output_rows, kCols}, 7));
      std::vector<const Tensor*> reads;
      if (previous.has_value()) reads.push_back(&*previous);
      OFFLOAD_RETURN_IF_ERROR(
          compute(sim.ComputeStream(), ComputeCall{name, 1000, reads, {&t}}));
      return t;
    };
    if (c.output_rows > 0) {
      StatusOr<Tensor> t = outside("output");
      if (!t.ok()) return t.status();
      output = std::move(*t);
    }
    previous.reset();
    std::vector<BytesFuture> futures;
    std::vector<std::vector<uint8_t>> expected;
    for (int l = n - 1; l >= 0; --l) {
      if (c.output_rows > 0) {
        StatusOr<Tensor> t = outside("grad");
        if (!t.ok()) return t.status();
        grad = std::move(*t);  // the previous one goes once this exists
      }
      BUDGET_TRY(off.BackwardStep(l));
      for (int t = static_cast<int>(saved[l].size()) - 1; t >= 0; --t) {
        for (const SavedTensor& h : saved[l][t]) {
          StatusOr<Tensor> popped = off.Pop(h);
          if (!popped.ok()) return popped.status();
          BUDGET_TRY(compute(sim.ComputeStream(),
                             ComputeCall{"bwd", 2 * c.layers[l][t].kernel_ns,
                                         {&*popped}, {}}));
          StatusOr<BytesFuture> f = capture(sim, *popped);
          if (!f.ok()) return f.status();
          futures.push_back(*f);
          expected.push_back(PatternTensorBytes(*popped, seeds[l][t]));
        }
      }
      saved[l].clear();
      output.reset();
    }
    grad.reset();
    Status finished = off.FinishBackward();
    sim.RunUntilIdle();
    run.peaks.push_back(sim.device_memory().peak_bytes);
    if (!finished.ok()) return finished;
    if (it == 0) run.planned = !off.BudgetPlanText().empty();
    for (size_t i = 0; i < futures.size(); ++i) {
      StatusOr<std::vector<uint8_t>> bytes = futures[i]();
      if (!bytes.ok()) return bytes.status();
      if (*bytes != expected[i]) ++run.mismatches;
    }
  }
  return OkStatus();
}

BudgetRun RunCase(const BudgetCase& c) {
  BudgetRun run;
  run.sim = std::make_unique<SimBackend>(c.sim);
  OffloadOptions options;
  options.model_layers = static_cast<int>(c.layers.size());
  options.min_offload_elements = kMinOffloadElements;
  options.activation_budget_bytes = c.Budget();
  options.retain_pinned_buffers = c.retain;
  if (c.probe) options.device_bytes_probe = &run.sim->InUseProbe();
  StatusOr<std::unique_ptr<Offloader>> off =
      Offloader::Create(*run.sim, options);
  if (!off.ok()) {
    run.status = off.status();
    return run;
  }
  run.offloader = std::move(off).value();
  run.status = RunIterations(c, run);
  return run;
}

// The plan can be impossible for a small budget (kResourceExhausted at the
// first FinishBackward); nothing else may fail.
bool Usable(const BudgetRun& run) {
  if (run.status.code() == StatusCode::kResourceExhausted && !run.planned &&
      run.peaks.size() == 1) {
    RC_TAG("budget too small for any plan");
    return false;
  }
  if (!run.status.ok()) RC_FAIL("run failed: " + run.status.ToString());
  RC_TAG("planned");
  return true;
}

// §6.2 with a budget, §6.3, §6.4: after the recorded iteration the peak of
// device memory (which here is saved tensors only) is within the budget
// plus the tensors that are never offloaded; bytes identical; no hazards;
// no device bytes left; pinned bytes only those retained.
RC_GTEST_PROP(BudgetProperties, WithinBudgetBitIdenticalNoHazardsNoLeaks, ()) {
  const BudgetCase c = *GenCase();
  BudgetRun run = RunCase(c);
  if (!Usable(run)) return;
  RC_ASSERT(run.mismatches == 0);
  if (!run.sim->hazards().empty()) {
    RC_FAIL("hazard: " + run.sim->hazards()[0].ToString());
  }
  const int64_t bound = c.Budget() + c.KeptBytes();
  for (size_t i = 1; i < run.peaks.size(); ++i) {
    RC_LOG() << "iteration " << i << " peak " << run.peaks[i] << " bound "
             << bound << "\n";
    RC_ASSERT(run.peaks[i] <= bound);
  }
  RC_ASSERT(run.sim->device_memory().live_bytes == 0);
  RC_ASSERT(run.sim->pinned_memory().live_bytes ==
            run.offloader->OffloadedBytes());
  run.offloader.reset();
  run.sim->RunUntilIdle();
  RC_ASSERT(run.sim->pinned_memory().live_bytes == 0);
  RC_ASSERT(run.sim->hazards().empty());
}

// SPEC §4.7 with a probe: the same stacks with an output and gradients the
// engine never sees; after the recorded iteration the peak as the
// simulator measures everything (device memory above none before the
// iteration; small kept tensors and the outside bytes included) is within
// the budget itself.
RC_GTEST_PROP(BudgetProperties, WithProbeWithinBudgetAsMeasured, ()) {
  BudgetCase c = *GenCase();
  c.probe = true;
  c.output_rows = *rc::gen::element<int64_t>(0, 4, 16, 64, 96);
  c.budget_fraction = *rc::gen::element(0.5, 0.75, 1.0, 1.5);
  BudgetRun run = RunCase(c);
  if (!Usable(run)) return;
  RC_ASSERT(run.mismatches == 0);
  if (!run.sim->hazards().empty()) {
    RC_FAIL("hazard: " + run.sim->hazards()[0].ToString());
  }
  for (size_t i = 1; i < run.peaks.size(); ++i) {
    RC_LOG() << "iteration " << i << " peak " << run.peaks[i] << " budget "
             << c.Budget() << "\n" << run.offloader->BudgetPlanText();
    RC_ASSERT(run.peaks[i] <= c.Budget());
  }
  RC_ASSERT(run.sim->device_memory().live_bytes == 0);
}

// The budget is not met by accident: when it is below the bytes of one
// step, the plan offloads and the peak after the first iteration is below
// the first (unplanned) iteration's.
RC_GTEST_PROP(BudgetProperties, TightBudgetsOffload, ()) {
  BudgetCase c = *GenCase();
  c.budget_fraction = *rc::gen::element(0.0, 0.25, 0.5);
  BudgetRun run = RunCase(c);
  if (!Usable(run)) return;
  RC_PRE(c.Budget() < c.OffloadableBytes());
  RC_ASSERT(run.offloader->stats().bytes_offloaded > 0);
  RC_ASSERT(run.peaks.back() < run.peaks.front());
}

// §6.6: the same case twice gives the same trace.
RC_GTEST_PROP(BudgetProperties, Deterministic, ()) {
  const BudgetCase c = *GenCase();
  BudgetRun a = RunCase(c);
  BudgetRun b = RunCase(c);
  RC_ASSERT(a.status.ToString() == b.status.ToString());
  RC_ASSERT(a.sim->trace() == b.sim->trace());
  RC_ASSERT(a.peaks == b.peaks);
}

// The workload driver's stacks (views of one qkv buffer, strided bases,
// repeated saves, composites, small and flagged tensors; a layer's buffers
// made at once) through a budget, as backends/cuda/cuda_budget_test runs
// them on the GPU: every byte right, no hazard, and the plan offloads.
TEST(BudgetWorkloadTest, DriverStacksThroughABudget) {
  int planned = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (double fraction : {0.3, 0.6}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " budget " +
                   std::to_string(fraction));
      SimBackend sim{SimOptions{}};
      RandomSpecOptions spec_options;
      spec_options.layers = 6;
      const WorkloadSpec spec = RandomWorkloadSpec(seed, spec_options);
      OffloadOptions options;
      options.model_layers = spec_options.layers;
      options.min_offload_elements = spec_options.min_offload_elements;
      options.activation_budget_bytes =
          int64_t(fraction * double(spec.TotalActivationBytes()));
      std::unique_ptr<Offloader> off =
          std::move(Offloader::Create(sim, options)).value();
      WorkloadOptions run;
      run.iterations = 4;
      run.allow_made_contiguous = true;
      StatusOr<WorkloadResult> result =
          RunWorkload(sim, *off, spec, SimWorkloadHooks(sim), run);
      if (!result.ok()) {
        EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted)
            << result.status();
        continue;
      }
      ++planned;
      EXPECT_TRUE(result->mismatches.empty());
      EXPECT_GT(off->stats().bytes_offloaded, 0) << off->BudgetPlanText();
      sim.RunUntilIdle();
      EXPECT_TRUE(sim.hazards().empty());
    }
  }
  EXPECT_GE(planned, 3);
}

}  // namespace
}  // namespace offload
