// The layer front door with a byte budget (SPEC §4.7,
// OffloadOptions::activation_budget_bytes): option checks, the recorded
// first iteration, the plan, what the policy refuses, and a workload that
// changes after the recording.

#include <memory>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fault_backend.h"
#include "testing/offload_test_util.h"
#include "testing/saved_tensor_forge.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

using ::offload::offload_test::Consume;
using ::offload::offload_test::Produce;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kLayers = 4;
constexpr int64_t kTensorBytes = 64 * 64 * 4;  // f32 [64, 64]

class BudgetOffloadTest : public ::testing::Test {
 protected:
  OffloadOptions Options(int64_t budget) {
    OffloadOptions o;
    o.model_layers = kLayers;
    o.min_offload_elements = 256;
    o.activation_budget_bytes = budget;
    return o;
  }

  // One iteration: `per_layer` tensors per layer, each produced after the
  // previous push and dropped by the caller once pushed; popped in reverse
  // and checked byte by byte.
  void Iteration(Offloader& off, int per_layer, uint64_t iteration,
                 StatusCode finish = StatusCode::kOk, int64_t columns = 64) {
    std::vector<std::vector<SavedTensor>> saved(kLayers);
    std::vector<std::vector<uint64_t>> seeds(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_OK_AND_ASSIGN(int layer, off.ForwardStep());
      ASSERT_EQ(layer, l);
      for (int t = 0; t < per_layer; ++t) {
        const uint64_t seed = iteration * 1000 + l * 10 + t;
        ASSERT_OK_AND_ASSIGN(
            Tensor x, Produce(sim_, DType::kF32, {64, columns}, seed, 1000));
        ASSERT_OK_AND_ASSIGN(SavedTensor h, off.Push(x));
        saved[l].push_back(h);
        seeds[l].push_back(seed);
      }
    }
    for (int l = kLayers - 1; l >= 0; --l) {
      ASSERT_OK(off.BackwardStep(l));
      for (int t = per_layer - 1; t >= 0; --t) {
        ASSERT_OK_AND_ASSIGN(Tensor x, off.Pop(saved[l][t]));
        ASSERT_OK(Consume(sim_, {x}, 1000));
        ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                             ReadTensorBytes(sim_, x));
        EXPECT_EQ(bytes, PatternTensorBytes(x, seeds[l][t]))
            << "layer " << l << " tensor " << t;
        saved[l][t] = SavedTensor();
      }
    }
    EXPECT_EQ(off.FinishBackward().code(), finish);
  }

  // A forward of one f32 [64, 64] tensor per layer (seed: the layer),
  // dropped by the caller once pushed; the handles go to `saved`.
  void ForwardOnePerLayer(Offloader& off, std::vector<SavedTensor>& saved) {
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_OK(off.ForwardStep().status());
      ASSERT_OK_AND_ASSIGN(Tensor x, Produce(sim_, DType::kF32, {64, 64}, l));
      ASSERT_OK_AND_ASSIGN(SavedTensor h, off.Push(x));
      saved.push_back(h);
    }
  }

  // The drop-notice tests: six layers of one tensor, a budget of two (the
  // plan offloads layers 0..3).
  OffloadOptions SixLayersBudgetOfTwo() {
    OffloadOptions o = Options(2 * kTensorBytes);
    o.model_layers = 6;
    return o;
  }

  // Their forward: per layer one f32 [64, 64] tensor made on `backend`
  // with seed 10 * it + layer, pushed and dropped by the caller.
  void PushOnePerLayer(Offloader& off, Backend& backend, int it,
                       std::vector<SavedTensor>& saved) {
    for (int l = 0; l < 6; ++l) {
      ASSERT_OK(off.ForwardStep().status());
      ASSERT_OK_AND_ASSIGN(
          Tensor x, MakeDeviceTensor(backend, DType::kF32, {64, 64}, 10 * it + l));
      ASSERT_OK_AND_ASSIGN(SavedTensor h, off.Push(x));
      saved.push_back(h);
    }
  }

  // Their backward of layer `l` after its BackwardStep: Pop (the handle
  // dropped with it, as autograd does), the reader enqueued, the bytes
  // checked; `popped` is the tensor, for the caller to drop.
  void PopAndRead(Offloader& off, Backend& backend, int it, int l,
                  std::vector<SavedTensor>& saved, Tensor& popped) {
    ASSERT_OK_AND_ASSIGN(popped, off.Pop(saved[l]));
    saved[l] = SavedTensor();
    ASSERT_OK(Consume(sim_, {popped}, 1000));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                         ReadTensorBytes(backend, popped));
    EXPECT_EQ(bytes, PatternTensorBytes(popped, 10 * it + l)) << "layer " << l;
  }

  SimBackend sim_{SimOptions{}};
};

TEST_F(BudgetOffloadTest, OptionsAreChecked) {
  OffloadOptions o = Options(0);
  EXPECT_THAT(Offloader::Create(sim_, o).status(),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("activation_budget_bytes must be positive")));
  o = Options(1 << 20);
  o.manual_synchronization = true;
  EXPECT_THAT(Offloader::Create(sim_, o).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("excludes")));
  o = Options(1 << 20);
  o.schedule = ScheduleTable{{0, ScheduleEntry{true, 2, false, 2}}};
  EXPECT_THAT(Offloader::Create(sim_, o).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("excludes")));
}

// Iteration 1 offloads nothing and is recorded; the plan then offloads the
// earliest tensors, and device memory stays within the budget.
TEST_F(BudgetOffloadTest, RecordsThenPlansWithinTheBudget) {
  const int64_t budget = 5 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget)));
  Iteration(*off, 3, 1);
  EXPECT_EQ(off->stats().bytes_offloaded, 0);
  const std::string plan = off->BudgetPlanText();
  EXPECT_THAT(plan, HasSubstr("budget " + std::to_string(budget)));
  EXPECT_TRUE(off->WillOffload(0));
  EXPECT_FALSE(off->WillOffload(kLayers - 1)) << plan;
  EXPECT_TRUE(off->schedule().empty());

  sim_.RunUntilIdle();
  sim_.ResetPeaks();
  Iteration(*off, 3, 2);
  sim_.RunUntilIdle();
  EXPECT_GT(off->stats().bytes_offloaded, 0);
  EXPECT_LE(sim_.device_memory().peak_bytes, budget);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

TEST_F(BudgetOffloadTest, ManualCallsAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(sim_, Options(1 << 20)));
  ASSERT_OK(off->ForwardStep().status());
  EXPECT_THAT(off->StartOffload(0),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("with an activation budget the plan")));
  EXPECT_THAT(off->ReleaseForwardMemory(0),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(off->StartReload(0), StatusIs(StatusCode::kFailedPrecondition));
}

// A budget no plan can keep (SPEC §7.8): the FinishBackward that plans says
// so once, naming the smallest budget that fits, and plans for that one; the
// next iterations run under it, nothing lost, no error again.
TEST_F(BudgetOffloadTest, ImpossibleBudgetIsRefusedOnceNamingTheSmallestThatFits) {
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(sim_, Options(kTensorBytes)));
  std::vector<SavedTensor> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardOnePerLayer(*off, saved));
  for (int l = kLayers - 1; l >= 0; --l) {
    ASSERT_OK(off->BackwardStep(l));
    ASSERT_OK(off->Pop(saved[l]).status());
  }
  saved.clear();
  // The caller drops each tensor once the next layer's is made: a unit can
  // go only at the end of the next push, so two are on device at once (and
  // in the backward the last layer's, kept, beside each reload).
  EXPECT_THAT(off->FinishBackward(),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("smallest budget that fits this workload is " +
                                 std::to_string(2 * kTensorBytes))));
  EXPECT_THAT(off->BudgetPlanText(),
              HasSubstr("budget " + std::to_string(2 * kTensorBytes)));
  Iteration(*off, 1, 2, StatusCode::kOk);
  Iteration(*off, 1, 2, StatusCode::kOk);
}

// More tensors than recorded: a warning naming the unit, the rest of the
// iteration stays on device, every byte comes back, and the next iteration
// is recorded again (its plan fits the new workload).
TEST_F(BudgetOffloadTest, ChangedWorkloadWarnsAndRecordsAgain) {
  ASSERT_OK_AND_ASSIGN(
      auto off, Offloader::Create(sim_, Options(5 * kTensorBytes)));
  Iteration(*off, 2, 1);
  const std::string first_plan = off->BudgetPlanText();
  Iteration(*off, 3, 2);
  ASSERT_EQ(off->diagnostics().warnings().size(), 1u);
  EXPECT_THAT(off->diagnostics().warnings()[0],
              HasSubstr("the workload changed in iteration 2: unit 2"));
  EXPECT_EQ(off->BudgetPlanText(), "");  // recorded again next
  Iteration(*off, 3, 3);
  EXPECT_NE(off->BudgetPlanText(), "");
  EXPECT_NE(off->BudgetPlanText(), first_plan);
  sim_.RunUntilIdle();
  sim_.ResetPeaks();
  Iteration(*off, 3, 4);
  sim_.RunUntilIdle();
  EXPECT_LE(sim_.device_memory().peak_bytes, 5 * kTensorBytes);
  EXPECT_EQ(off->diagnostics().warnings().size(), 1u);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

// Batches of another length (the same ops, other sizes: dynamic padding).
// Units smaller than recorded follow the plan within its budget; under the
// smallest budget (OffloadActivations() without one, torchtune's usage)
// larger ones follow it too. A larger workload under a caller's budget is
// recorded again, once; the plan made for it then serves smaller ones.
TEST_F(BudgetOffloadTest, BatchesOfAnotherLengthFollowThePlan) {
  const int64_t budget = 5 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget)));
  Iteration(*off, 3, 1);
  const std::string plan = off->BudgetPlanText();
  for (const int64_t columns : {32, 48, 64, 16}) {
    SCOPED_TRACE(columns);
    const int64_t before = off->stats().bytes_offloaded;
    sim_.RunUntilIdle();
    sim_.ResetPeaks();
    Iteration(*off, 3, 2, StatusCode::kOk, columns);
    sim_.RunUntilIdle();
    EXPECT_GT(off->stats().bytes_offloaded, before);
    EXPECT_LE(sim_.device_memory().peak_bytes, budget);
    EXPECT_EQ(off->BudgetPlanText(), plan);
  }
  EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  Iteration(*off, 3, 3, StatusCode::kOk, /*columns=*/96);  // larger
  EXPECT_EQ(off->diagnostics().warnings().size(), 1u);
  Iteration(*off, 3, 4, StatusCode::kOk, 96);  // recorded
  Iteration(*off, 3, 5, StatusCode::kOk, 64);
  EXPECT_EQ(off->diagnostics().warnings().size(), 1u);

  OffloadOptions smallest = Options(1);
  smallest.smallest_budget = true;
  ASSERT_OK_AND_ASSIGN(auto least, Offloader::Create(sim_, smallest));
  Iteration(*least, 3, 1);
  for (const int64_t columns : {96, 32, 128}) {
    SCOPED_TRACE(columns);
    const int64_t before = least->stats().bytes_offloaded;
    Iteration(*least, 3, 2, StatusCode::kOk, columns);
    EXPECT_GT(least->stats().bytes_offloaded, before);
  }
  EXPECT_THAT(least->diagnostics().warnings(), IsEmpty());
  sim_.RunUntilIdle();
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

// A pop refused for a wrong handle changes nothing: the plan's frees and
// reloads of that call have not run, and the right pop then works.
TEST_F(BudgetOffloadTest, RefusedPopChangesNothing) {
  ASSERT_OK_AND_ASSIGN(
      auto off, Offloader::Create(sim_, Options(5 * kTensorBytes)));
  Iteration(*off, 3, 1);
  std::vector<SavedTensor> saved;
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_OK(off->ForwardStep().status());
    for (int t = 0; t < 3; ++t) {
      ASSERT_OK_AND_ASSIGN(Tensor x,
                           Produce(sim_, DType::kF32, {64, 64}, 10 * l + t));
      ASSERT_OK_AND_ASSIGN(SavedTensor h, off->Push(x));
      saved.push_back(h);
    }
  }
  ASSERT_OK(off->BackwardStep(kLayers - 1));
  const int64_t reloaded = off->stats().bytes_reloaded;
  EXPECT_THAT(off->PopComposite(saved.back()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(off->stats().bytes_reloaded, reloaded);
}

// A handle whose unit or index is out of range (forged, or corrupted) is
// refused before the call's frees and reloads run, never read out of
// bounds; the real handle still pops.
TEST_F(BudgetOffloadTest, ForgedHandleFieldsAreRangeChecked) {
  ASSERT_OK_AND_ASSIGN(
      auto off, Offloader::Create(sim_, Options(3 * kTensorBytes)));
  Iteration(*off, 1, 1);
  std::vector<SavedTensor> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardOnePerLayer(*off, saved));
  ASSERT_TRUE(saved[0].in_group()) << off->BudgetPlanText();
  for (int l = kLayers - 1; l >= 1; --l) {
    ASSERT_OK(off->BackwardStep(l));
    ASSERT_OK(off->Pop(saved[l]).status());
  }
  ASSERT_OK(off->BackwardStep(0));
  const int64_t reloaded = off->stats().bytes_reloaded;
  for (SavedTensor::InGroup bad :
       {SavedTensor::InGroup{9, 0}, SavedTensor::InGroup{-1, 0},
        SavedTensor::InGroup{0, 5}, SavedTensor::InGroup{0, -2}}) {
    EXPECT_THAT(off->Pop(SavedTensorForge::Like(saved[0], bad)),
                StatusIs(StatusCode::kInvalidArgument))
        << bad.group << "/" << bad.index;
  }
  EXPECT_EQ(off->stats().bytes_reloaded, reloaded);
  ASSERT_OK_AND_ASSIGN(Tensor x, off->Pop(saved[0]));
  ASSERT_OK(Consume(sim_, {x}, 1000));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadTensorBytes(sim_, x));
  EXPECT_EQ(bytes, PatternTensorBytes(x, 0));
  ASSERT_OK(off->FinishBackward());
  sim_.RunUntilIdle();
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

// A pop of a handle whose unit this very call frees (every handle of the
// unit was popped; popping a handle again is allowed in layer mode) is
// refused before the call's frees run: the unit is not released by the
// failed call, its bytes and state stay, and the next call frees it.
TEST_F(BudgetOffloadTest, PopRefusedBecauseThisCallFreesItChangesNothing) {
  ASSERT_OK_AND_ASSIGN(
      auto off, Offloader::Create(sim_, Options(3 * kTensorBytes)));
  Iteration(*off, 1, 1);
  ASSERT_THAT(off->BudgetPlanText(), HasSubstr("offload"));
  std::vector<SavedTensor> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardOnePerLayer(*off, saved));
  std::vector<Tensor> popped;  // kept: no drop notice frees anything
  for (int l = kLayers - 1; l >= 0; --l) {
    ASSERT_OK(off->BackwardStep(l));
    ASSERT_OK_AND_ASSIGN(Tensor x, off->Pop(saved[l]));
    popped.push_back(x);
  }
  ASSERT_TRUE(saved[0].in_group()) << off->BudgetPlanText();
  const GroupState state = off->state(0);
  ASSERT_EQ(state, GroupState::kReloadStarted);
  const int64_t host = off->OffloadedBytes();
  sim_.RunUntilIdle();
  const int64_t device = sim_.device_memory().live_bytes;
  EXPECT_THAT(off->Pop(saved[0]),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("frees its memory at this call")));
  EXPECT_EQ(off->state(0), state);
  EXPECT_EQ(off->OffloadedBytes(), host);
  sim_.RunUntilIdle();
  EXPECT_EQ(sim_.device_memory().live_bytes, device);
  popped.clear();
  saved.clear();
  EXPECT_OK(off->FinishBackward());
  sim_.RunUntilIdle();
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

// SPEC §4.7 "as soon as the budget has room": the memory of a reloaded unit
// goes back when the caller drops the last popped view of it, not at the
// next engine call, and the reload that was waiting for that room starts
// there too. Six layers of one tensor, a budget of two: layers 0..3 are
// offloaded; in the backward, dropping the popped tensor of layer 3 (after
// its reader is enqueued) frees it and starts layer 1's reload, before
// BackwardStep(2).
TEST_F(BudgetOffloadTest, DroppingAPoppedTensorFreesItAndStartsTheNextReload) {
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(sim_, SixLayersBudgetOfTwo()));
  for (int it = 1; it <= 2; ++it) {
    std::vector<SavedTensor> saved;
    ASSERT_NO_FATAL_FAILURE(PushOnePerLayer(*off, sim_, it, saved));
    for (int l = 5; l >= 0; --l) {
      ASSERT_OK(off->BackwardStep(l));
      Tensor x;
      ASSERT_NO_FATAL_FAILURE(PopAndRead(*off, sim_, it, l, saved, x));
      Tensor view = x;  // a second view: the memory stays until both go
      x = Tensor();
      if (it == 2 && l == 3) {
        EXPECT_EQ(off->state(3), GroupState::kReloadStarted);
        EXPECT_EQ(off->stats().bytes_reloaded, 2 * kTensorBytes);
      }
      view = Tensor();
      if (it == 2 && l == 3) {
        EXPECT_EQ(off->state(3), GroupState::kReleased);
        EXPECT_EQ(off->stats().bytes_reloaded, 3 * kTensorBytes);
        EXPECT_EQ(off->state(1), GroupState::kReloadStarted);
      }
    }
    ASSERT_OK(off->FinishBackward());
    if (it == 1) {
      EXPECT_TRUE(off->WillOffload(3)) << off->BudgetPlanText();
      EXPECT_FALSE(off->WillOffload(4)) << off->BudgetPlanText();
      sim_.RunUntilIdle();
      sim_.ResetPeaks();
    }
  }
  sim_.RunUntilIdle();
  EXPECT_EQ(off->stats().bytes_reloaded, 4 * kTensorBytes);
  EXPECT_LE(sim_.device_memory().peak_bytes, 2 * kTensorBytes);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

// Autograd drops a saved tensor once the node that read it has run, which
// may come after the next engine call: the plan's free of its unit then
// leaves its memory held. A reload due at that call waits for the drop
// where it would not fit beside it (SPEC §6.2: never the budget); the
// drop starts it. Six layers of one tensor, a budget of two: layer 3's
// popped tensor is held through BackwardStep(2), where layer 1's reload is
// due; dropped after it, layer 1 comes back before its own pop.
TEST_F(BudgetOffloadTest, ADueReloadWaitsForAPoppedTensorHeldPastItsFree) {
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(sim_, SixLayersBudgetOfTwo()));
  for (int it = 1; it <= 2; ++it) {
    std::vector<SavedTensor> saved;
    ASSERT_NO_FATAL_FAILURE(PushOnePerLayer(*off, sim_, it, saved));
    Tensor late;  // layer 3's, held past BackwardStep(2) in iteration 2
    for (int l = 5; l >= 0; --l) {
      ASSERT_OK(off->BackwardStep(l));
      if (it == 2 && l == 2) {
        EXPECT_EQ(off->state(1), GroupState::kOffloadFinished);
        late = Tensor();
        EXPECT_EQ(off->state(1), GroupState::kReloadStarted);
      }
      Tensor x;
      ASSERT_NO_FATAL_FAILURE(PopAndRead(*off, sim_, it, l, saved, x));
      if (it == 2 && l == 3) late = x;
    }
    ASSERT_OK(off->FinishBackward());
    if (it == 1) {
      sim_.RunUntilIdle();
      sim_.ResetPeaks();
    }
  }
  sim_.RunUntilIdle();
  EXPECT_EQ(off->stats().bytes_reloaded, 4 * kTensorBytes);
  EXPECT_LE(sim_.device_memory().peak_bytes, 2 * kTensorBytes);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

// A popped tensor may outlive its iteration and the Offloader: dropping it
// then does nothing but give its memory back.
TEST_F(BudgetOffloadTest, PoppedTensorsMayOutliveTheIterationAndTheOffloader) {
  std::vector<Tensor> kept;
  {
    ASSERT_OK_AND_ASSIGN(auto off,
                         Offloader::Create(sim_, SixLayersBudgetOfTwo()));
    for (int it = 1; it <= 3; ++it) {
      std::vector<SavedTensor> saved;
      ASSERT_NO_FATAL_FAILURE(PushOnePerLayer(*off, sim_, it, saved));
      for (int l = 5; l >= 0; --l) {
        ASSERT_OK(off->BackwardStep(l));
        Tensor x;
        ASSERT_NO_FATAL_FAILURE(PopAndRead(*off, sim_, it, l, saved, x));
        if (it >= 2 && l == 0) kept.push_back(x);  // offloaded in both
      }
      saved.clear();
      ASSERT_OK(off->FinishBackward());
    }
    kept.erase(kept.begin());  // iteration 2's, dropped in iteration 3's wake
    EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  }
  ASSERT_EQ(kept.size(), 1u);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                       ReadTensorBytes(sim_, kept[0]));
  EXPECT_EQ(bytes, PatternTensorBytes(kept[0], 30));
  kept.clear();
  sim_.RunUntilIdle();
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

// The work a dropped view starts cannot return a status: when it fails it
// is warned about, nothing is freed unordered, and the next call retries.
// Here the reload that the drop of layer 3's tensor starts finds no device
// memory; BackwardStep(2) starts it; every byte comes back.
TEST_F(BudgetOffloadTest, AFailureAtADropIsWarnedAndRetriedAtTheNextCall) {
  FaultInjectingBackend fault(sim_);
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(fault, SixLayersBudgetOfTwo()));
  for (int it = 1; it <= 2; ++it) {
    std::vector<SavedTensor> saved;
    ASSERT_NO_FATAL_FAILURE(PushOnePerLayer(*off, fault, it, saved));
    for (int l = 5; l >= 0; --l) {
      ASSERT_OK(off->BackwardStep(l));
      if (it == 2 && l == 2) {
        EXPECT_EQ(off->state(1), GroupState::kReloadStarted);
      }
      Tensor x;
      ASSERT_NO_FATAL_FAILURE(PopAndRead(*off, fault, it, l, saved, x));
      if (it == 2 && l == 3) fault.FailDeviceAllocations(0, 1);
      x = Tensor();
      if (it == 2 && l == 3) {
        EXPECT_EQ(fault.injected(), 1);
        EXPECT_EQ(off->state(3), GroupState::kReleased);
        EXPECT_EQ(off->state(1), GroupState::kOffloadFinished);
        ASSERT_EQ(off->diagnostics().warnings().size(), 1u);
        EXPECT_THAT(off->diagnostics().warnings()[0],
                    HasSubstr("retried at the next call"));
      }
    }
    ASSERT_OK(off->FinishBackward());
  }
  sim_.RunUntilIdle();
  EXPECT_EQ(off->stats().bytes_reloaded, 4 * kTensorBytes);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

}  // namespace
}  // namespace offload
