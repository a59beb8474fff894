// The byte budget (SPEC §4.7) with more than one workload through one
// offloader: a GAN's generator and discriminator under one context, or
// batches of a few lengths. Each workload, known by its first unit, is
// recorded once and follows its own plan from then on.

#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/offload_test_util.h"
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

class BudgetWorkloadsTest : public ::testing::Test {
 protected:
  OffloadOptions Options(int64_t budget) {
    OffloadOptions o;
    o.model_layers = kLayers;
    o.min_offload_elements = 256;
    o.activation_budget_bytes = budget;
    return o;
  }

  // One iteration of a workload: `lead` small f32 [4, 4] tensors (never
  // offloaded) first, then `per_layer` f32 [64, columns] tensors per layer,
  // each dropped by the caller once pushed, popped in reverse and checked
  // byte by byte; returns the bytes it offloaded and its peak.
  struct Ran {
    int64_t offloaded = 0;
    int64_t peak = 0;
  };
  Ran Iteration(Offloader& off, int per_layer, int64_t columns, uint64_t it,
                int lead = 0) {
    const int64_t before = off.stats().bytes_offloaded;
    sim_.RunUntilIdle();
    sim_.ResetPeaks();
    std::vector<std::vector<SavedTensor>> saved(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_OK(off.ForwardStep().status());
      const int count = per_layer + (l == 0 ? lead : 0);
      for (int t = 0; t < count; ++t) {
        const bool small = l == 0 && t < lead;
        StatusOr<Tensor> x =
            Produce(sim_, DType::kF32, {small ? 4 : 64, small ? 4 : columns},
                    it * 1000 + l * 10 + t, 1000);
        EXPECT_OK(x.status());
        StatusOr<SavedTensor> h = off.Push(*x);
        EXPECT_OK(h.status());
        saved[l].push_back(*h);
      }
    }
    for (int l = kLayers - 1; l >= 0; --l) {
      EXPECT_OK(off.BackwardStep(l));
      for (int t = static_cast<int>(saved[l].size()) - 1; t >= 0; --t) {
        StatusOr<Tensor> x = off.Pop(saved[l][t]);
        EXPECT_OK(x.status());
        EXPECT_OK(Consume(sim_, {*x}, 1000));
        StatusOr<std::vector<uint8_t>> bytes = ReadTensorBytes(sim_, *x);
        EXPECT_OK(bytes.status());
        EXPECT_EQ(*bytes, PatternTensorBytes(*x, it * 1000 + l * 10 + t))
            << "layer " << l << " tensor " << t;
        saved[l][t] = SavedTensor();
      }
    }
    EXPECT_OK(off.FinishBackward());
    sim_.RunUntilIdle();
    return {off.stats().bytes_offloaded - before,
            sim_.device_memory().peak_bytes};
  }

  SimBackend sim_{SimOptions{}};
};

// Two models in turn, the second's tensors wider: the first iteration of
// each is recorded (the second's warned about once, as a new workload) and
// every later one follows its own plan, offloading, within the budget,
// with no more warnings. (Before, each switch warned "the workload
// changed", kept the rest on device and recorded the next iteration, so
// neither model offloaded anything.)
TEST_F(BudgetWorkloadsTest, TwoModelsInTurnEachFollowTheirOwnPlan) {
  const int64_t budget = 8 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget)));
  EXPECT_EQ(Iteration(*off, 3, 64, 1).offloaded, 0);  // recorded
  const std::string first = off->BudgetPlanText();
  EXPECT_EQ(Iteration(*off, 2, 96, 2).offloaded, 0);  // recorded
  ASSERT_EQ(off->diagnostics().warnings().size(), 1u);
  EXPECT_THAT(off->diagnostics().warnings()[0],
              HasSubstr("a new workload in iteration 2: its first unit"));
  const std::string second = off->BudgetPlanText();
  EXPECT_NE(second, first);
  for (uint64_t it = 3; it < 9; ++it) {
    SCOPED_TRACE(it);
    const bool wide = it % 2 == 0;
    const Ran ran = Iteration(*off, wide ? 2 : 3, wide ? 96 : 64, it);
    EXPECT_GT(ran.offloaded, 0);
    EXPECT_LE(ran.peak, budget);
    EXPECT_EQ(off->BudgetPlanText(), wide ? second : first);
  }
  EXPECT_EQ(off->diagnostics().warnings().size(), 1u);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

// The second model's first unit is smaller than the first's: it follows
// the first's plan (as a shorter batch would) until its third tensor in
// layer 0 diverges (warned; the rest kept on device). The next time it
// comes it is recorded, and from then on each follows its own plan, the
// first's kept meanwhile.
TEST_F(BudgetWorkloadsTest, AWorkloadThatDivergesLaterIsRecordedWhenItComesAgain) {
  const int64_t budget = 6 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget)));
  Iteration(*off, 2, 64, 1);  // recorded
  const std::string first = off->BudgetPlanText();
  Iteration(*off, 4, 32, 2);  // diverges at its third unit
  ASSERT_EQ(off->diagnostics().warnings().size(), 1u);
  EXPECT_THAT(off->diagnostics().warnings()[0],
              HasSubstr("the workload changed in iteration 2"));
  EXPECT_EQ(off->BudgetPlanText(), "");
  EXPECT_GT(Iteration(*off, 2, 64, 3).offloaded, 0);  // the kept plan
  EXPECT_EQ(off->BudgetPlanText(), first);
  EXPECT_EQ(Iteration(*off, 4, 32, 4).offloaded, 0);  // recorded
  ASSERT_EQ(off->diagnostics().warnings().size(), 2u);
  EXPECT_THAT(off->diagnostics().warnings()[1], HasSubstr("a new workload"));
  const std::string second = off->BudgetPlanText();
  for (uint64_t it = 5; it < 9; ++it) {
    SCOPED_TRACE(it);
    const bool narrow = it % 2 == 0;
    const Ran ran = Iteration(*off, narrow ? 4 : 2, narrow ? 32 : 64, it);
    EXPECT_GT(ran.offloaded, 0);
    EXPECT_LE(ran.peak, budget);
    EXPECT_EQ(off->BudgetPlanText(), narrow ? second : first);
  }
  EXPECT_EQ(off->diagnostics().warnings().size(), 2u);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

// More workloads than are kept (ten, told apart by how many small tensors
// come before their first unit): the least recently kept plan goes, and
// that workload is recorded again when it comes (nothing lost, each
// iteration's bytes checked).
TEST_F(BudgetWorkloadsTest, BeyondTheKeptWorkloadsTheOldestIsRecordedAgain) {
  ASSERT_OK_AND_ASSIGN(auto off,
                       Offloader::Create(sim_, Options(8 * kTensorBytes)));
  uint64_t it = 1;
  for (int w = 0; w < 10; ++w) {
    EXPECT_EQ(Iteration(*off, 3, 64, it++, /*lead=*/w).offloaded, 0);
  }
  EXPECT_EQ(off->diagnostics().warnings().size(), 9u);
  // The plans of the last nine (one in force, eight kept) are followed.
  EXPECT_GT(Iteration(*off, 3, 64, it++, 9).offloaded, 0);
  EXPECT_GT(Iteration(*off, 3, 64, it++, 1).offloaded, 0);
  // The first's was dropped: recorded again.
  EXPECT_EQ(Iteration(*off, 3, 64, it++, 0).offloaded, 0);
  EXPECT_GT(Iteration(*off, 3, 64, it++, 0).offloaded, 0);
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

}  // namespace
}  // namespace offload
