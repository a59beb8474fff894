// SPEC §7.1–7.4: the iteration's life cycle as autograd drives it
// (engine/training_loop.h), on the simulated GPU: every popped byte checked,
// no hazard, and device and pinned memory back where they were once the
// graphs are gone.

#include "engine/training_loop.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/loop_test_util.h"
#include "testing/offload_test_util.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using offload_test::SimOffloadTest;
using loop_test::LoopGraph;
using loop_test::LoopHarness;

constexpr int kLayers = 4;

OffloadOptions Options(int offloaded = 2) {
  OffloadOptions options;
  options.model_layers = kLayers;
  options.offloaded_layers = offloaded;
  options.min_offload_elements = 1024;
  options.keep_host_copies = true;
  return options;
}

class TrainingLoopTest : public SimOffloadTest {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(loop_, TrainingLoop::Create(*sim_, Options()));
    harness_.emplace(*sim_, *loop_);
    baseline_ = sim_->device_memory().live_bytes;
  }
  // Memory once every graph is gone: the device as before, no host copy.
  void ExpectNothingHeld() {
    sim_->RunUntilIdle();
    EXPECT_EQ(sim_->device_memory().live_bytes, baseline_);
    EXPECT_EQ(loop_->OffloadedBytes(), 0);
    EXPECT_EQ(loop_->live_iterations(), 0);
  }
  int Warned(const std::string& text) const {
    int n = 0;
    for (const std::string& w : loop_->Warnings()) {
      n += w.find(text) != std::string::npos;
    }
    return n;
  }

  std::unique_ptr<TrainingLoop> loop_;
  std::optional<LoopHarness> harness_;
  int64_t baseline_ = 0;
};

TEST_F(TrainingLoopTest, StepsReuseOneOffloaderAndReturnAllMemory) {
  for (int step = 0; step < 3; ++step) {
    LoopGraph graph = harness_->Forward(kLayers);
    ASSERT_OK(harness_->Backward(graph, /*lowest=*/0, /*retain=*/false));
    ASSERT_OK(loop_->PassEnded());
    EXPECT_EQ(loop_->live_iterations(), 0) << "step " << step;
  }
  EXPECT_EQ(loop_->pooled_offloaders(), 1);
  EXPECT_GT(loop_->current_offloader()->stats().bytes_offloaded, 0);
  ExpectNothingHeld();
}

// §7.1: frozen first layers, a detached input, backward(inputs=...): the
// pass stops above layer 0, and still ends the iteration.
TEST_F(TrainingLoopTest, PartialBackwardEndsTheIteration) {
  LoopGraph graph = harness_->Forward(kLayers);
  graph.DropLayersBelow(2);  // never reached: autograd frees them with the graph
  ASSERT_OK(harness_->Backward(graph, /*lowest=*/2, /*retain=*/false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->live_iterations(), 0);
  graph = LoopGraph();
  // The next step runs normally, on the same Offloader.
  LoopGraph next = harness_->Forward(kLayers);
  ASSERT_OK(harness_->Backward(next, 0, false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->pooled_offloaders(), 1);
  ExpectNothingHeld();
}

// §7.1 with the unreached handles still alive at the pass's end (the graph
// lives until the caller drops its loss): the host copies stay until then.
TEST_F(TrainingLoopTest, UnreachedHandlesKeepTheIterationUntilFreed) {
  LoopGraph graph = harness_->Forward(kLayers);
  ASSERT_OK(harness_->Backward(graph, /*lowest=*/2, /*retain=*/false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->live_iterations(), 1);
  EXPECT_GT(loop_->OffloadedBytes(), 0);
  // The next forward does not wait for it.
  LoopGraph next = harness_->Forward(kLayers);
  EXPECT_EQ(loop_->pooled_offloaders(), 2);
  graph = LoopGraph();  // the old graph goes
  EXPECT_EQ(loop_->live_iterations(), 1);
  ASSERT_OK(harness_->Backward(next, 0, false));
  ASSERT_OK(loop_->PassEnded());
  ExpectNothingHeld();
}

// §7.3: retain_graph, then a second traversal: every tensor back, twice.
TEST_F(TrainingLoopTest, RetainedGraphIsTraversedAgain) {
  LoopGraph graph = harness_->Forward(kLayers);
  ASSERT_OK(harness_->Backward(graph, 0, /*retain=*/true));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->live_iterations(), 1);
  // A gradient penalty reaching only the top layers, then the full pass.
  ASSERT_OK(harness_->Backward(graph, 2, /*retain=*/true));
  ASSERT_OK(loop_->PassEnded());
  ASSERT_OK(harness_->Backward(graph, 0, /*retain=*/false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->live_iterations(), 0);
  // Layers 0 and 1 are offloaded: reloaded by the first and the last pass
  // (the second one prefetches one of them too).
  const OffloaderStats& stats = loop_->current_offloader()->stats();
  EXPECT_GT(stats.bytes_offloaded, 0);
  EXPECT_GE(stats.bytes_reloaded, 2 * stats.bytes_offloaded);
  graph = LoopGraph();
  ExpectNothingHeld();
}

// §7.2: an exception inside a layer, then a retry from layer 0.
TEST_F(TrainingLoopTest, ExceptionInsideALayerAbandonsTheForward) {
  LoopGraph failed = harness_->Forward(/*layers=*/3);
  ASSERT_OK(loop_->AbandonForward());
  EXPECT_EQ(Warned("dropped after 3 of 4"), 1);
  failed = LoopGraph();
  LoopGraph retry = harness_->Forward(kLayers);
  EXPECT_EQ(retry.layers_seen(), (std::vector<int>{0, 1, 2, 3}));
  ASSERT_OK(harness_->Backward(retry, 0, false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->pooled_offloaders(), 1);
  ExpectNothingHeld();
}

// §7.2: an exception between layers (outside any layer): the graph is freed,
// and the next forward starts over.
TEST_F(TrainingLoopTest, GraphFreedMidForwardIsAbandonedAtTheNextForward) {
  LoopGraph failed = harness_->Forward(/*layers=*/2);
  failed = LoopGraph();
  LoopGraph retry = harness_->Forward(kLayers);
  EXPECT_EQ(retry.layers_seen(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Warned("freed in the middle of its forward"), 1);
  ASSERT_OK(harness_->Backward(retry, 0, false));
  ASSERT_OK(loop_->PassEnded());
  ExpectNothingHeld();
}

// §7.2: a backward that raises (a NaN check in a gradient hook, an
// out-of-memory error) never ends its pass: autograd runs no end callback,
// and the caller's next forward is the first to say so (PassEnded). Told
// whether a backward runs, the loop ends the iteration as soon as its graph
// is freed outside one: what it reloaded for the pass and its host copies
// are not held until the next step. Untold, they are.
TEST_F(TrainingLoopTest, ABackwardThatRaisedEndsOnceItsGraphIsFreedOutsideABackward) {
  for (const bool told : {true, false}) {
    SCOPED_TRACE(told ? "told whether a backward runs" : "not told");
    bool running = true;
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<TrainingLoop> loop,
        TrainingLoop::Create(*sim_, Options(),
                             told ? std::function<bool()>([&running] {
                               return running;
                             })
                                  : nullptr));
    LoopHarness harness(*sim_, *loop);
    LoopGraph graph = harness.Forward(kLayers);
    // The pass runs layers 3 and 2, freeing their tensors as autograd does
    // (the next offloaded layer, 1, is reloaded ahead), then raises.
    ASSERT_OK(harness.Backward(graph, /*lowest=*/2, /*retain=*/false));
    running = false;
    sim_->RunUntilIdle();
    EXPECT_GT(sim_->device_memory().live_bytes, baseline_);
    EXPECT_EQ(loop->live_iterations(), 1);  // the caller holds its loss
    graph = LoopGraph();                    // and drops it
    sim_->RunUntilIdle();
    if (told) {
      EXPECT_EQ(loop->live_iterations(), 0);
      EXPECT_EQ(sim_->device_memory().live_bytes, baseline_);
      EXPECT_EQ(loop->OffloadedBytes(), 0);
    } else {
      EXPECT_EQ(loop->live_iterations(), 1);
      EXPECT_GT(sim_->device_memory().live_bytes, baseline_);
    }
    // The next step's forward ends the stale pass first (the package's
    // end_stale_pass), then runs as any other, on the same Offloader.
    ASSERT_OK(loop->PassEnded());
    EXPECT_EQ(loop->live_iterations(), 0);
    running = true;
    LoopGraph next = harness.Forward(kLayers);
    ASSERT_OK(harness.Backward(next, 0, false));
    ASSERT_OK(loop->PassEnded());
    EXPECT_EQ(loop->live_iterations(), 0);
    EXPECT_EQ(loop->pooled_offloaders(), 1);
    sim_->RunUntilIdle();
    EXPECT_EQ(sim_->device_memory().live_bytes, baseline_);
  }
}

// A graph whose saved tensors all go during its own backward (autograd frees
// each after its node ran) ends at the pass's end, not before: the pass
// still runs.
TEST_F(TrainingLoopTest, AGraphFreedDuringItsOwnBackwardEndsAtThePassEnd) {
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<TrainingLoop> loop,
      TrainingLoop::Create(*sim_, Options(), [] { return true; }));
  LoopHarness harness(*sim_, *loop);
  LoopGraph graph = harness.Forward(kLayers);
  ASSERT_OK(harness.Backward(graph, 0, /*retain=*/false));
  graph = LoopGraph();
  EXPECT_EQ(loop->live_iterations(), 1);
  ASSERT_OK(loop->PassEnded());
  EXPECT_EQ(loop->live_iterations(), 0);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, baseline_);
}

// §7.2: an evaluation with grad on (a whole forward, no backward).
TEST_F(TrainingLoopTest, ForwardWithoutBackwardIsAbandonedWhenItsGraphGoes) {
  LoopGraph eval = harness_->Forward(kLayers);
  LoopGraph train = harness_->Forward(kLayers);
  EXPECT_EQ(train.layers_seen(), (std::vector<int>{0, 1, 2, 3}));
  eval = LoopGraph();
  EXPECT_EQ(Warned("dropped after 4 of 4"), 1);
  ASSERT_OK(harness_->Backward(train, 0, false));
  ASSERT_OK(loop_->PassEnded());
  ExpectNothingHeld();
}

// §7.1, §7.2: a forward that hands the engine nothing to move (a layer
// schedule's tensors all under the size threshold; a byte budget's forward
// that pushed nothing) holds nothing: dropped without a backward, it
// releases nothing and says nothing (a tiny model warned at every step).
// A forward that did offload is warned about (the tests above).
TEST_F(TrainingLoopTest, ForwardThatHandedOverNothingIsDroppedWithoutAWord) {
  for (const bool budget : {false, true}) {
    SCOPED_TRACE(budget ? "byte budget" : "layer schedule");
    OffloadOptions options = Options();
    options.min_offload_elements = 1 << 20;  // the harness's tensors: 4096
    if (budget) {
      options.offloaded_layers = 0;
      options.activation_budget_bytes = 1;
      options.smallest_budget = true;
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingLoop> loop,
                         TrainingLoop::Create(*sim_, options));
    LoopHarness harness(*sim_, *loop, /*tensors_per_layer=*/budget ? 0 : 2);
    for (int step = 0; step < 2; ++step) {
      LoopGraph eval = harness.Forward(kLayers, /*expected_ids=*/true);
      eval = LoopGraph();  // an evaluation with grad on: no backward
      LoopGraph train = harness.Forward(kLayers, /*expected_ids=*/true);
      ASSERT_OK(harness.Backward(train, 0, false));
      ASSERT_OK(loop->PassEnded());
    }
    EXPECT_EQ(loop->live_iterations(), 0);
    EXPECT_THAT(loop->Warnings(), IsEmpty());
  }
}

// §7.4: two forwards, one backward pass over both.
TEST_F(TrainingLoopTest, SeveralForwardsBeforeOneBackward) {
  LoopGraph first = harness_->Forward(kLayers);
  LoopGraph second = harness_->Forward(kLayers);
  EXPECT_NE(first.iteration_id(), second.iteration_id());
  ASSERT_OK(harness_->Backward(second, 0, false));
  ASSERT_OK(harness_->Backward(first, 0, false));
  ASSERT_OK(loop_->PassEnded());
  EXPECT_EQ(loop_->pooled_offloaders(), 2);
  ExpectNothingHeld();
}

// A layer run out of order (a block applied twice) stays on device.
TEST_F(TrainingLoopTest, LayerOutOfOrderRunsOutsideOffloading) {
  ASSERT_OK_AND_ASSIGN(LoopLayer zero, loop_->ForwardStep(0));
  EXPECT_EQ(zero.layer, 0);
  ASSERT_OK_AND_ASSIGN(LoopLayer again, loop_->ForwardStep(2));
  EXPECT_EQ(again.layer, -1);
  EXPECT_EQ(Warned("runs outside offloading"), 1);
}

// §7.3 under a byte budget: the second traversal follows the plan again.
TEST(TrainingLoopBudgetTest, RetainedGraphUnderABudgetIsTraversedAgain) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options = Options();
  options.activation_budget_bytes = 64 << 10;  // of 256 KiB saved
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingLoop> loop,
                       TrainingLoop::Create(*sim, options));
  LoopHarness harness(*sim, *loop);
  {  // The recorded iteration, then the plan's first.
    LoopGraph recorded = harness.Forward(kLayers);
    ASSERT_OK(harness.Backward(recorded, 0, false));
    ASSERT_OK(loop->PassEnded());
  }
  for (int step = 0; step < 2; ++step) {
    LoopGraph graph = harness.Forward(kLayers);
    ASSERT_OK(harness.Backward(graph, 0, /*retain=*/true));
    ASSERT_OK(loop->PassEnded());
    ASSERT_OK(harness.Backward(graph, 2, /*retain=*/true));
    ASSERT_OK(loop->PassEnded());
    ASSERT_OK(harness.Backward(graph, 0, false));
    ASSERT_OK(loop->PassEnded());
  }
  EXPECT_GT(loop->current_offloader()->stats().bytes_offloaded, 0);
  EXPECT_EQ(loop->live_iterations(), 0);
  EXPECT_TRUE(sim->hazards().empty());
}

// A recording traversed twice plans at its first traversal's end; a budget
// of one unit (16 KiB) is refused once (SPEC §7.8), naming the smallest
// that fits, and planned for it.
TEST(TrainingLoopBudgetTest, RetainedRecordingPlansAtItsFirstTraversal) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options = Options();
  options.activation_budget_bytes = 16 << 10;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingLoop> loop,
                       TrainingLoop::Create(*sim, options));
  LoopHarness harness(*sim, *loop);
  LoopGraph recorded = harness.Forward(kLayers);
  ASSERT_OK(harness.Backward(recorded, 0, /*retain=*/true));
  EXPECT_THAT(loop->PassEnded(),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("smallest budget that fits")));
  EXPECT_THAT(loop->current_offloader()->BudgetPlanText(),
              HasSubstr("budget 32768"));
  ASSERT_OK(harness.Backward(recorded, 0, false));
  ASSERT_OK(loop->PassEnded());
  EXPECT_EQ(loop->live_iterations(), 0);
}

// Without keep_host_copies a second traversal is refused, naming why.
TEST(TrainingLoopBudgetTest, SecondTraversalWithoutHostCopiesIsRefusedClearly) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options = Options();
  options.keep_host_copies = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingLoop> loop,
                       TrainingLoop::Create(*sim, options));
  LoopHarness harness(*sim, *loop);
  LoopGraph graph = harness.Forward(kLayers);
  ASSERT_OK(harness.Backward(graph, 0, /*retain=*/true));
  ASSERT_OK(loop->PassEnded());
  EXPECT_THAT(harness.Backward(graph, 0, false),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("cannot be traversed twice")));
}

TEST(TrainingLoopCreateTest, RefusesWhatTheOffloaderRefuses) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options = Options();
  options.offloaded_layers = kLayers;
  EXPECT_THAT(TrainingLoop::Create(*sim, options).status(),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace offload
