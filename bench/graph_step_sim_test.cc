// The GPU benchmark's layer-stack step (RunStep, layer_stack.h) captured
// into a graph by CaptureStep, on the simulator: each launch moves the bytes
// of an eager offloaded step with the copies of an eager step, within the
// device memory of an eager step, with no hazard, and frees all of its
// device memory; the graph of a step without offloading peaks higher. This
// is the order of calls that graph_capture_test runs on the GPU (where it
// checks every output and gradient byte), checked without a GPU.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "bench/bench_util.h"
#include "bench/layer_stack.h"
#include "bench/sim_bound.h"
#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/schedule.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "gtest/gtest.h"

namespace offload::bench {
namespace {

// GEMMs as simulated kernels (sim_bound.h): 0.2 ms forward, 0.4 ms
// backward, reads and writes declared for the hazard detector.
std::unique_ptr<Exec> NewExec(SimBackend& sim) {
  std::array<double, kGemms> ns;
  for (int g = 0; g < kGemms; ++g) ns[g] = g < 5 ? 200'000 : 400'000;
  return NewSimExec(sim, ns);
}

Shape SmallStack() {
  Shape s;
  s.layers = 4;
  s.hidden = 512;
  s.tokens = 1024;  // 512K elements per [T,H] tensor: all five offloadable
  return s;
}

// Copies (count and bytes) in the trace from entry `from` on.
struct Copies {
  int count = 0;
  int64_t bytes = 0;
};
Copies CopiesSince(const SimBackend& sim, size_t from) {
  Copies c;
  const auto& trace = sim.trace();
  for (size_t i = from; i < trace.size(); ++i) {
    if (trace[i].phase == SimPhase::kStart &&
        trace[i].kind == SimOpKind::kCopy) {
      c.count += 1;
      c.bytes += trace[i].bytes;
    }
  }
  return c;
}

struct StepFigures {
  int64_t peak = 0;
  Copies copies;
};

// An eager offloaded step after two warm-up steps, on a simulator of its own.
StepFigures Eager(const Shape& s, const OffloadOptions& options) {
  SimOptions so;
  so.store_bytes = false;
  SimBackend sim(so);
  std::unique_ptr<Exec> sim_exec = NewExec(sim);
  Exec& ex = *sim_exec;
  auto off = Must(Offloader::Create(sim, options), "Create");
  RunStep(ex, *off, s);
  RunStep(ex, *off, s);
  sim.RunUntilIdle();
  sim.ResetPeaks();
  const size_t from = sim.trace().size();
  RunStep(ex, *off, s);
  sim.RunUntilIdle();
  EXPECT_TRUE(sim.hazards().empty()) << sim.hazards().size() << " hazards";
  return {sim.device_memory().peak_bytes, CopiesSince(sim, from)};
}

// CaptureStep's graph, launched `launches` times; the figures of the last.
StepFigures Launched(const Shape& s, const OffloadOptions& options,
                     int launches) {
  SimOptions so;
  so.store_bytes = false;
  SimBackend sim(so);
  std::unique_ptr<Exec> sim_exec = NewExec(sim);
  Exec& ex = *sim_exec;
  auto off = Must(Offloader::Create(sim, options), "Create");
  CapturedStep captured = CaptureStep(ex, *off, s, 1);
  EXPECT_NE(captured.graph, nullptr);
  if (captured.graph == nullptr) return {};
  EXPECT_GT(captured.graph->size(), 0);
  EXPECT_EQ(captured.cost.pushes, 5 * s.layers);
  auto exec = sim.Instantiate(*captured.graph);
  EXPECT_TRUE(exec.ok()) << exec.status().ToString();
  if (!exec.ok()) return {};
  StepFigures f;
  for (int i = 0; i < launches; ++i) {
    sim.RunUntilIdle();
    sim.ResetPeaks();
    const size_t from = sim.trace().size();
    const Status launched = sim.Launch(**exec, sim.ComputeStream());
    EXPECT_TRUE(launched.ok()) << launched.ToString();
    sim.RunUntilIdle();
    f = {sim.device_memory().peak_bytes, CopiesSince(sim, from)};
  }
  EXPECT_TRUE(sim.hazards().empty()) << sim.hazards().size() << " hazards";
  EXPECT_EQ(sim.device_memory().live_bytes, 0) << "graph memory not freed";
  return f;
}

TEST(GraphStepSimTest, LaunchesMatchAnEagerOffloadedStep) {
  const Shape s = SmallStack();
  const OffloadOptions options = BenchOptions(s, 2, -1, false);
  const StepFigures eager = Eager(s, options);
  const StepFigures graph = Launched(s, options, 2);
  // Two of four layers out and back: five tensors each way per layer.
  EXPECT_EQ(eager.copies.count, 2 * 2 * 5);
  EXPECT_EQ(eager.copies.bytes, 2 * 2 * SavedBytesPerLayer(s));
  EXPECT_EQ(graph.copies.count, eager.copies.count);
  EXPECT_EQ(graph.copies.bytes, eager.copies.bytes);
  EXPECT_EQ(graph.peak, eager.peak);

  const StepFigures none = Launched(s, BenchOptions(s, 0, -1, false), 1);
  EXPECT_EQ(none.copies.count, 0);
  EXPECT_GE(none.peak, graph.peak + SavedBytesPerLayer(s))
      << "offloading 2 of 4 layers should save at least a layer's bytes";
}

TEST(GraphStepSimTest, ScheduleTableIsCapturedToo) {
  const Shape s = SmallStack();
  OffloadOptions options = BenchOptions(s, 0, -1, false);
  // Layers 0 and 2, with their own release and reload points.
  options.schedule = ScheduleTable{{0, {true, 2, false, 3}},
                                   {2, {true, 4, false, 1}}};
  const Status valid = ValidateSchedule(*options.schedule, s.layers);
  ASSERT_TRUE(valid.ok()) << valid.ToString();
  const StepFigures eager = Eager(s, options);
  const StepFigures graph = Launched(s, options, 2);
  EXPECT_EQ(eager.copies.bytes, 2 * 2 * SavedBytesPerLayer(s));
  EXPECT_EQ(graph.copies.count, eager.copies.count);
  EXPECT_EQ(graph.copies.bytes, eager.copies.bytes);
  EXPECT_EQ(graph.peak, eager.peak);
}

}  // namespace
}  // namespace offload::bench
