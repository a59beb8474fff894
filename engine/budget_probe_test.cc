// The byte budget with a probe of device bytes in use (SPEC §4.7,
// OffloadOptions::device_bytes_probe): the budget bounds the bytes as the
// user measures them, not only the saved tensors. The workload is a layer
// stack on the simulator whose last layer's output and whose gradients the
// engine never sees; the simulator's own probe (SimBackend::InUseProbe)
// counts them.

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
constexpr int64_t kKernelNs = 1000;

class BudgetProbeTest : public ::testing::Test {
 protected:
  OffloadOptions Options(int64_t budget, bool probe) {
    OffloadOptions o;
    o.model_layers = kLayers;
    o.min_offload_elements = 256;
    o.activation_budget_bytes = budget;
    if (probe) o.device_bytes_probe = &sim_.InUseProbe();
    return o;
  }

  // One iteration of the stack. Layer l saves its input x and one
  // intermediate h and makes its output y (the next layer's x). The last
  // output (three tensors wide) is never pushed: it lives until the loss
  // read it, before the backward. Then the gradient dy is made; each
  // layer's backward pops h and x, makes dx from dy and drops dy:
  // gradients are never pushed either. Returns the simulator's peak
  // (device time) above its bytes before the iteration, which hold nothing
  // of it: the user's measure between the first push and the last pop.
  int64_t Iteration(Offloader& off, uint64_t it,
                    StatusCode finish = StatusCode::kOk) {
    sim_.RunUntilIdle();
    const int64_t before = sim_.device_memory().live_bytes;
    sim_.ResetPeaks();
    std::vector<SavedTensor> saved_x(kLayers), saved_h(kLayers);
    StatusOr<Tensor> x = Produce(sim_, DType::kF32, {64, 64}, it * 100, kKernelNs);
    EXPECT_OK(x.status());
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_OK(off.ForwardStep().status());
      StatusOr<SavedTensor> hx = off.Push(*x);
      EXPECT_OK(hx.status());
      saved_x[l] = *hx;
      StatusOr<Tensor> h =
          Produce(sim_, DType::kF32, {64, 64}, it * 100 + 10 + l, kKernelNs);
      EXPECT_OK(h.status());
      StatusOr<SavedTensor> hh = off.Push(*h);
      EXPECT_OK(hh.status());
      saved_h[l] = *hh;
      // The last layer's output (logits) is three tensors wide.
      const int64_t width = l == kLayers - 1 ? 3 * 64 : 64;
      StatusOr<Tensor> y =
          Produce(sim_, DType::kF32, {64, width}, it * 100 + l + 1, kKernelNs);
      EXPECT_OK(y.status());
      x = std::move(y);  // drops h and the caller's x
    }
    EXPECT_OK(Consume(sim_, {*x}, kKernelNs));  // the loss
    x = Tensor();
    StatusOr<Tensor> dy = Produce(sim_, DType::kF32, {64, 64}, 7, kKernelNs);
    EXPECT_OK(dy.status());
    for (int l = kLayers - 1; l >= 0; --l) {
      EXPECT_OK(off.BackwardStep(l));
      StatusOr<Tensor> h = off.Pop(saved_h[l]);
      EXPECT_OK(h.status());
      saved_h[l] = SavedTensor();
      StatusOr<Tensor> xi = off.Pop(saved_x[l]);
      EXPECT_OK(xi.status());
      saved_x[l] = SavedTensor();
      EXPECT_OK(Consume(sim_, {*h, *xi, *dy}, kKernelNs));
      StatusOr<std::vector<uint8_t>> bytes = ReadTensorBytes(sim_, *xi);
      EXPECT_OK(bytes.status());
      EXPECT_EQ(*bytes, PatternTensorBytes(*xi, it * 100 + l)) << "layer " << l;
      StatusOr<Tensor> dx = Produce(sim_, DType::kF32, {64, 64}, 8, kKernelNs);
      EXPECT_OK(dx.status());
      dy = std::move(dx);  // drops dy, h and x
    }
    dy = Tensor();
    EXPECT_EQ(off.FinishBackward().code(), finish);
    sim_.RunUntilIdle();
    return sim_.device_memory().peak_bytes - before;
  }

  SimBackend sim_{SimOptions{}};
};

// Eight saved tensors, a budget of five. Without the probe the plan keeps
// five saved tensors on device and the output and gradients come on top;
// with it the peak as the simulator measures it stays within the budget.
TEST_F(BudgetProbeTest, PeakAsMeasuredStaysWithinTheBudget) {
  const int64_t budget = 5 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto blind, Offloader::Create(sim_, Options(budget, false)));
  Iteration(*blind, 1);
  const int64_t blind_peak = Iteration(*blind, 2);
  EXPECT_GT(blind->stats().bytes_offloaded, 0);
  // The gap the probe closes (SPEC §4.7 without a probe: saved tensors
  // only).
  EXPECT_GT(blind_peak, budget);
  blind.reset();

  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget, true)));
  Iteration(*off, 1);
  const std::string plan = off->BudgetPlanText();
  int64_t peak = 0;
  for (uint64_t it = 2; it <= 3; ++it) peak = Iteration(*off, it);
  EXPECT_GT(off->stats().bytes_offloaded, 0);
  EXPECT_LE(peak, budget) << plan;
  EXPECT_THAT(sim_.hazards(), IsEmpty());
  EXPECT_THAT(off->diagnostics().warnings(), IsEmpty());
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

// A budget no plan keeps once the outside bytes count is refused once,
// naming the smallest that fits, which is then planned and kept.
TEST_F(BudgetProbeTest, TooSmallBudgetIsRefusedNamingTheSmallestWithOutsideBytes) {
  const int64_t budget = 3 * kTensorBytes;
  ASSERT_OK_AND_ASSIGN(auto blind, Offloader::Create(sim_, Options(budget, false)));
  Iteration(*blind, 1);
  blind.reset();
  ASSERT_OK_AND_ASSIGN(auto off, Offloader::Create(sim_, Options(budget, true)));
  Iteration(*off, 1, StatusCode::kResourceExhausted);
  const std::string plan = off->BudgetPlanText();
  ASSERT_THAT(plan, HasSubstr("budget "));
  const size_t at = plan.rfind("budget ");
  const int64_t smallest = std::stoll(plan.substr(at + 7));
  EXPECT_GT(smallest, budget);
  const int64_t peak = Iteration(*off, 2);
  EXPECT_LE(peak, smallest) << plan;
  EXPECT_THAT(sim_.hazards(), IsEmpty());
}

TEST_F(BudgetProbeTest, ProbeNeedsABudget) {
  OffloadOptions o;
  o.model_layers = kLayers;
  o.device_bytes_probe = &sim_.InUseProbe();
  EXPECT_THAT(Offloader::Create(sim_, o).status(),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("device_bytes_probe needs")));
}

// The simulator's probe: host order, everything allocated through it, and
// a high-water mark of its own.
TEST_F(BudgetProbeTest, SimProbeCountsInHostOrder) {
  DeviceBytesProbe& probe = sim_.InUseProbe();
  EXPECT_EQ(probe.InUseBytes(), 0);
  {
    ASSERT_OK_AND_ASSIGN(Tensor a, Produce(sim_, DType::kF32, {64, 64}, 1, kKernelNs));
    ASSERT_OK_AND_ASSIGN(Tensor b, Produce(sim_, DType::kF32, {64, 64}, 2, kKernelNs));
    EXPECT_EQ(probe.InUseBytes(), 2 * kTensorBytes);
  }
  EXPECT_EQ(probe.InUseBytes(), 0);  // freed in host order, pending on device
  sim_.ResetPeaks();
  EXPECT_EQ(probe.TakePeakBytes(), 2 * kTensorBytes);
  EXPECT_EQ(probe.TakePeakBytes(), 0);
  sim_.RunUntilIdle();
  EXPECT_EQ(sim_.device_memory().live_bytes, 0);
}

}  // namespace
}  // namespace offload
