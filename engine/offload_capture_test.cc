// The layer mode under graph capture (SPEC §5.7), on the simulator: warm-up
// iterations offload nothing; a captured iteration runs nothing until it is
// launched; every launch moves the same bytes as an eager iteration, with new
// inputs, within the same memory, with no hazard; what cannot be captured is
// refused with a clear error.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/backend_wrapper.h"
#include "engine/offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/graph_step.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kMiB = int64_t{1} << 20;

GraphStepSpec FourLayers() {
  GraphStepSpec spec;
  spec.saves = {{2 * kMiB, kMiB}, {2 * kMiB, kMiB}, {2 * kMiB, kMiB},
                {2 * kMiB, kMiB}};
  spec.repeat_first = true;
  return spec;
}

OffloadOptions KOfN(int n, int k) {
  OffloadOptions options;
  options.model_layers = n;
  options.offloaded_layers = k;
  options.min_offload_elements = 1024;
  return options;
}

int Count(const SimBackend& sim, size_t from, SimOpKind kind) {
  int count = 0;
  const auto& trace = sim.trace();
  for (size_t i = from; i < trace.size(); ++i) {
    if (trace[i].phase == SimPhase::kStart && trace[i].kind == kind) ++count;
  }
  return count;
}

int CountCopies(const SimBackend& sim, size_t from) {
  return Count(sim, from, SimOpKind::kCopy);
}

class OffloadCaptureTest : public ::testing::Test {
 protected:
  // One warm-up iteration, then a captured one; returns the instantiated
  // graph. The simulator is idle afterwards.
  std::unique_ptr<GraphExec> WarmUpAndCapture(Offloader& offloader,
                                              const GraphStepSpec& spec) {
    EXPECT_OK(offloader.BeginWarmup());
    EXPECT_OK(EnqueueGraphStep(*sim_, offloader, spec, inputs_));
    EXPECT_OK(offloader.EndWarmup());
    sim_->RunUntilIdle();
    EXPECT_OK(offloader.BeginCapture());
    EXPECT_OK(EnqueueGraphStep(*sim_, offloader, spec, inputs_));
    StatusOr<std::unique_ptr<Graph>> graph = offloader.EndCapture();
    EXPECT_OK(graph.status());
    if (!graph.ok()) return nullptr;
    StatusOr<std::unique_ptr<GraphExec>> exec = sim_->Instantiate(**graph);
    EXPECT_OK(exec.status());
    return exec.ok() ? std::move(exec).value() : nullptr;
  }

  // Launches `exec` with inputs of `epoch` and runs it; returns the device
  // high-water mark of the launch.
  int64_t LaunchAndRun(GraphExec& exec, uint64_t epoch) {
    inputs_.set_epoch(epoch);
    inputs_.ResetChecks();
    sim_->ResetPeaks();
    EXPECT_OK(sim_->Launch(exec, sim_->ComputeStream()));
    sim_->RunUntilIdle();
    return sim_->device_memory().peak_bytes;
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
  GraphStepInputs inputs_;
};

TEST_F(OffloadCaptureTest, WarmUpOffloadsNothingAndPassesTensorsThrough) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  const GraphStepSpec spec = FourLayers();
  ASSERT_OK(offloader->BeginWarmup());
  EXPECT_TRUE(offloader->warming_up());
  const size_t from = sim_->trace().size();
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  sim_->RunUntilIdle();
  EXPECT_EQ(CountCopies(*sim_, from), 0);
  EXPECT_EQ(offloader->stats().pinned_allocations, 0);
  EXPECT_EQ(offloader->stats().tensors_offloaded, 0);
  EXPECT_EQ(inputs_.checked_bytes(), spec.CheckedBytes());
  EXPECT_THAT(inputs_.mismatches(), IsEmpty());
  ASSERT_OK(offloader->EndWarmup());
  EXPECT_FALSE(offloader->warming_up());
  // The next eager iteration offloads again.
  const size_t eager = sim_->trace().size();
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  sim_->RunUntilIdle();
  EXPECT_GT(CountCopies(*sim_, eager), 0);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

TEST_F(OffloadCaptureTest, CapturedStepRunsOnlyWhenLaunchedWithNewInputs) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  const GraphStepSpec spec = FourLayers();
  ASSERT_OK(offloader->BeginWarmup());
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  ASSERT_OK(offloader->EndWarmup());
  sim_->RunUntilIdle();
  inputs_.ResetChecks();

  ASSERT_OK(offloader->BeginCapture());
  EXPECT_TRUE(offloader->capturing());
  const size_t from = sim_->trace().size();
  const int64_t pinned_before = sim_->pinned_memory().live_bytes;
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph, offloader->EndCapture());
  EXPECT_FALSE(offloader->capturing());
  sim_->RunUntilIdle();
  EXPECT_EQ(CountCopies(*sim_, from), 0) << "a capture runs nothing";
  EXPECT_EQ(inputs_.checked_bytes(), 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, pinned_before);
  EXPECT_GT(graph->size(), 0);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       sim_->Instantiate(*graph));
  for (uint64_t epoch : {7u, 8u, 9u}) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    const size_t launch = sim_->trace().size();
    LaunchAndRun(*exec, epoch);
    // Layers 0 and 1 go out and come back: two spans' copies each way per
    // layer (the repeated tensor is copied once, SPEC §2.4).
    EXPECT_EQ(CountCopies(*sim_, launch), 2 * 2 * 2);
    // 8 activations, then one device block per reloaded span (2 layers x 2
    // spans): a captured reload does not take one block per group (CUDA's
    // graph allocator could not fit it in the freed activations).
    EXPECT_EQ(Count(*sim_, launch, SimOpKind::kAlloc), 8 + 2 * 2);
    EXPECT_EQ(inputs_.checked_bytes(), spec.CheckedBytes());
    EXPECT_THAT(inputs_.mismatches(), IsEmpty());
  }
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

TEST_F(OffloadCaptureTest, ReplayUsesTheMemoryOfAnEagerStep) {
  const GraphStepSpec spec = FourLayers();
  // Eager reference on its own simulator: warm-up, then one offloaded step.
  int64_t eager_peak = 0;
  {
    auto sim = NewSimBackend(SimOptions{});
    GraphStepInputs inputs;
    ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim, KOfN(4, 2)));
    ASSERT_OK(offloader->BeginWarmup());
    ASSERT_OK(EnqueueGraphStep(*sim, *offloader, spec, inputs));
    ASSERT_OK(offloader->EndWarmup());
    sim->RunUntilIdle();
    sim->ResetPeaks();
    ASSERT_OK(EnqueueGraphStep(*sim, *offloader, spec, inputs));
    sim->RunUntilIdle();
    eager_peak = sim->device_memory().peak_bytes;
  }
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  std::unique_ptr<GraphExec> exec = WarmUpAndCapture(*offloader, spec);
  ASSERT_NE(exec, nullptr);
  const int64_t replay_peak = LaunchAndRun(*exec, 3);
  EXPECT_EQ(replay_peak, eager_peak);
  // At most n - k = 2 layers resident, plus the layer being reloaded ahead.
  EXPECT_LE(replay_peak, 3 * spec.LayerBytes(0));
  EXPECT_LT(replay_peak, 4 * spec.LayerBytes(0)) << "nothing was offloaded";
  EXPECT_EQ(sim_->device_memory().live_bytes, 0) << "graph memory freed";
}

TEST_F(OffloadCaptureTest, ManualScheduleIsCapturedToo) {
  OffloadOptions options = KOfN(4, 0);
  options.manual_synchronization = true;
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, options));
  GraphStepSpec spec = FourLayers();
  spec.manual = true;
  spec.manual_offloaded = 3;
  std::unique_ptr<GraphExec> exec = WarmUpAndCapture(*offloader, spec);
  ASSERT_NE(exec, nullptr);
  for (uint64_t epoch : {11u, 12u}) {
    const size_t launch = sim_->trace().size();
    LaunchAndRun(*exec, epoch);
    EXPECT_EQ(CountCopies(*sim_, launch), 3 * 2 * 2);
    EXPECT_EQ(inputs_.checked_bytes(), spec.CheckedBytes());
    EXPECT_THAT(inputs_.mismatches(), IsEmpty());
  }
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

// Eager iterations with retained buffers before the capture, and after it:
// the capture reuses their pinned buffers without waiting on work recorded
// outside it (the pool is settled first), and eager steps after it offload
// again without waiting on work the capture recorded (which never ran).
TEST_F(OffloadCaptureTest, EagerStepsBeforeAndAfterACaptureShareThePool) {
  OffloadOptions options = KOfN(4, 2);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, options));
  const GraphStepSpec spec = FourLayers();
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  const int64_t pinned = offloader->stats().pinned_allocations;
  EXPECT_GT(pinned, 0);
  std::unique_ptr<GraphExec> exec = WarmUpAndCapture(*offloader, spec);
  ASSERT_NE(exec, nullptr);
  EXPECT_EQ(offloader->stats().pinned_allocations, pinned);
  LaunchAndRun(*exec, 5);
  EXPECT_THAT(inputs_.mismatches(), IsEmpty());
  EXPECT_EQ(inputs_.checked_bytes(), spec.CheckedBytes());
  // Eager again, then the graph again.
  inputs_.ResetChecks();
  const size_t eager = sim_->trace().size();
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  sim_->RunUntilIdle();
  EXPECT_EQ(CountCopies(*sim_, eager), 2 * 2 * 2);
  EXPECT_THAT(offloader->diagnostics().warnings(), IsEmpty());
  LaunchAndRun(*exec, 6);
  EXPECT_THAT(inputs_.mismatches(), IsEmpty());
  EXPECT_EQ(inputs_.checked_bytes(), spec.CheckedBytes());
  EXPECT_EQ(offloader->stats().pinned_allocations, pinned);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

TEST_F(OffloadCaptureTest, CaptureNeedsAWarmUpRecord) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  EXPECT_THAT(offloader->BeginCapture(),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("layer 0"), HasSubstr("warm-up"))));
  EXPECT_FALSE(offloader->capturing());
  EXPECT_FALSE(sim_->IsCapturing(sim_->ComputeStream()));
}

TEST_F(OffloadCaptureTest, EndCaptureMidIterationNamesTheMovingLayersAndGoesOn) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  GraphStepSpec spec = FourLayers();
  ASSERT_OK(offloader->BeginWarmup());
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  ASSERT_OK(offloader->EndWarmup());
  ASSERT_OK(offloader->BeginCapture());
  // Forward only so far: layer 0's copy to host is in flight.
  for (int l = 0; l < 2; ++l) ASSERT_OK(offloader->ForwardStep().status());
  ASSERT_OK_AND_ASSIGN(Buffer buffer,
                       sim_->AllocateDevice(kMiB, sim_->ComputeStream()));
  Tensor tensor;
  tensor.storage = std::make_shared<Storage>(std::move(buffer));
  tensor.dtype = DType::kU8;
  tensor.shape = {kMiB};
  tensor.strides = {1};
  ASSERT_OK_AND_ASSIGN(SavedTensor saved, offloader->Push(tensor));
  EXPECT_THAT(offloader->BeginWarmup(),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(offloader->EndCapture().status(),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("layer 0 (offload_started)"),
                             HasSubstr("goes on"))));
  EXPECT_TRUE(offloader->capturing());
  EXPECT_TRUE(sim_->IsCapturing(sim_->ComputeStream()));
  // End it behind the engine's back, so that teardown runs eagerly.
  (void)sim_->EndCapture(sim_->ComputeStream());
}

TEST_F(OffloadCaptureTest, ChangedTensorsAfterWarmUpFailTheCapture) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  GraphStepSpec spec = FourLayers();
  ASSERT_OK(offloader->BeginWarmup());
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  ASSERT_OK(offloader->EndWarmup());
  sim_->RunUntilIdle();
  ASSERT_OK(offloader->BeginCapture());
  spec.saves[1][0] += kMiB;  // layer 1 saves more than in the warm-up
  ASSERT_OK(EnqueueGraphStep(*sim_, *offloader, spec, inputs_));
  EXPECT_THAT(offloader->EndCapture().status(),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("layer 1"), HasSubstr("dropped"))));
  EXPECT_FALSE(offloader->capturing());
  EXPECT_FALSE(sim_->IsCapturing(sim_->ComputeStream()));
}

TEST_F(OffloadCaptureTest, CallsOutOfPlaceAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, KOfN(4, 2)));
  EXPECT_THAT(offloader->EndWarmup(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(offloader->EndCapture().status(),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(offloader->ForwardStep().status());
  EXPECT_THAT(offloader->BeginWarmup(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("middle of iteration 1")));
  EXPECT_THAT(offloader->BeginCapture(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("whole iterations")));
  EXPECT_FALSE(sim_->IsCapturing(sim_->ComputeStream()));
}

TEST_F(OffloadCaptureTest, ByteBudgetIsNotCapturable) {
  OffloadOptions options = KOfN(4, 0);
  options.activation_budget_bytes = 8 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, options));
  EXPECT_THAT(offloader->BeginWarmup(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("byte budget")));
  EXPECT_THAT(offloader->BeginCapture(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("byte budget")));
}

// A backend without the capability: the Offloader says so.
class NoGraphs final : public BackendWrapper {
 public:
  using BackendWrapper::BackendWrapper;
  bool SupportsGraphs() const override { return false; }
};

TEST_F(OffloadCaptureTest, BackendWithoutGraphsIsUnimplemented) {
  NoGraphs backend(*sim_);
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(backend, KOfN(4, 2)));
  EXPECT_THAT(offloader->BeginCapture(),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("graph capture")));
}

}  // namespace
}  // namespace offload
