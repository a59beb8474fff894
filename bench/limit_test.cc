// Tests of the memory-budget limit (limit.h) and of the layer stack's
// timeline and problem it is computed for (layer_stack_timeline.h,
// stack_limit.h, bench_output.h).

#include "bench/limit.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_output.h"
#include "bench/layer_stack.h"
#include "bench/layer_stack_timeline.h"
#include "bench/sim_bound.h"
#include "bench/stack_limit.h"
#include "engine/status.h"
#include "gtest/gtest.h"

namespace offload::bench {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Per-GEMM times measured on the H200 at hidden 4096 (bench/results/
// 2026-11-23-h200-push-at/gemm/h4096.md), whole microseconds so that the
// simulator (integer ns) runs exactly these durations.
constexpr std::array<double, kGemms> kH4096Ms = {
    1.181, 1.157, 0.401, 1.620, 1.537, 1.623, 1.604, 1.549,
    1.603, 0.405, 0.398, 1.182, 1.177, 1.169, 1.177};

std::array<double, kGemms> Ns(const std::array<double, kGemms>& ms) {
  std::array<double, kGemms> ns;
  for (int g = 0; g < kGemms; ++g) ns[g] = ms[g] * 1e6;
  return ns;
}

LimitBandwidth Link(double gbps) { return {gbps, gbps, 0, 0}; }

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

LimitResult Solve(const LimitProblem& p) {
  StatusOr<LimitResult> r = ComputeLimit(p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : LimitResult{};
}

// Three kernels of 1 ms. Kernel 0 writes tensor A (100 MB), which kernel 2
// reads back; kernel 1 writes B (100 MB), used by nothing after it.
LimitProblem Tiny(int64_t budget, double gbps) {
  LimitProblem p;
  p.kernel_ms = {1, 1, 1};
  LimitTensor a;
  a.bytes = 100'000'000;
  a.producer = 0;
  a.ready = 0;
  a.free_after = 0;
  a.needed_at = 2;
  a.last_use = 2;
  LimitTensor b;
  b.bytes = 100'000'000;
  b.producer = 1;
  b.ready = 1;
  b.free_after = 1;
  b.last_use = 1;
  p.tensors = {a, b};
  p.bandwidth = Link(gbps);
  p.budget_bytes = budget;
  return p;
}

TEST(LimitTest, TinyInstanceMatchesTheHandComputedOptimum) {
  // Budget 150 MB: 50 MB of A must leave before kernel 1 starts (B is
  // allocated then), and only the stall before it can carry them:
  // 50 MB / 25 MB/ms = 2 ms. They come back during kernel 1 (1 ms) and the
  // stall before kernel 2 (1 ms more).
  const LimitResult r = Solve(Tiny(150'000'000, 25));
  ASSERT_TRUE(r.feasible);
  EXPECT_NEAR(r.step_ms, 3 + 2 + 1, 1e-9);
  EXPECT_NEAR(r.stall_ms[1], 2, 1e-9);
  EXPECT_NEAR(r.stall_ms[2], 1, 1e-9);
  // Both fit: no stall.
  EXPECT_NEAR(Solve(Tiny(200'000'000, 25)).step_ms, 3, 1e-9);
  // Twice the link: 1 ms out, 1 ms back during kernel 1.
  EXPECT_NEAR(Solve(Tiny(150'000'000, 50)).step_ms, 3 + 1, 1e-9);
}

TEST(LimitTest, BudgetBelowWhatMustStayIsInfeasible) {
  LimitProblem p = Tiny(0, 25);
  // At kernel 0's start A is being written, at kernel 1's B: 100 MB each.
  EXPECT_EQ(MinimumResidentBytes(p), 100'000'000);
  p.budget_bytes = 100'000'000 - 1;
  EXPECT_FALSE(Solve(p).feasible);
}

TEST(LimitTest, ContentionOfBothDirectionsCounts) {
  // Two tensors: A leaves before kernel 1 and is back at kernel 2, while B
  // (written by kernel 1) must leave before kernel 2. With both directions
  // at full speed at once the copies overlap; when each direction drops to
  // half while the other runs, the link is shared and the step grows.
  LimitProblem p;
  p.kernel_ms = {1, 1, 1, 1};
  LimitTensor a{100'000'000, 0, 0, 0, 2, 2};
  LimitTensor b{100'000'000, 1, 1, 1, 3, 3};
  p.tensors = {a, b};
  p.budget_bytes = 100'000'000;
  p.bandwidth = Link(50);
  const double free_duplex = Solve(p).step_ms;
  p.bandwidth = {50, 50, 25, 25};
  const double shared = Solve(p).step_ms;
  EXPECT_GT(shared, free_duplex + 0.5);
  p.bandwidth = {50, 50, 10, 10};  // worse than taking turns: turns
  EXPECT_NEAR(Solve(p).step_ms, shared, 1e-9);
}

TEST(LimitTest, RejectsInconsistentProblems) {
  LimitProblem p = Tiny(0, 25);
  p.tensors[0].needed_at = 0;  // needed back before it left
  EXPECT_EQ(ComputeLimit(p).status().code(), StatusCode::kInvalidArgument);
  p = Tiny(0, 0);
  EXPECT_EQ(ComputeLimit(p).status().code(), StatusCode::kInvalidArgument);
}

class StackLimitTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Hidden 4096, 8192 tokens, pushes per GEMM; 4 layers keep the
    // programs small (the tool solves 8 in a few seconds each).
    shape_ = new Shape();
    shape_->layers = 4;
    timeline_ = new StackTimeline(RecordTimeline(*shape_));
  }
  static void TearDownTestSuite() {
    delete timeline_;
    delete shape_;
  }
  static LimitResult Limit(int64_t budget, double gbps) {
    return Solve(StackLimitProblem(*timeline_, kH4096Ms, Link(gbps), budget));
  }
  static Shape* shape_;
  static StackTimeline* timeline_;
};
Shape* StackLimitTest::shape_ = nullptr;
StackTimeline* StackLimitTest::timeline_ = nullptr;

TEST_F(StackLimitTest, TimelineIsTheStepOfLayerStack) {
  const Shape eight;  // 8 layers
  const StackTimeline t = RecordTimeline(eight);
  ASSERT_EQ(t.kernels.size(), size_t(8 * kGemms));
  // Five saved tensors per layer and the last layer's output.
  ASSERT_EQ(t.tensors.size(), size_t(8 * 5 + 1));
  int saved = 0;
  for (const StackTensor& st : t.tensors) saved += st.saved();
  EXPECT_EQ(saved, 40);
  // Layer 0's qkv: written by its first GEMM, read by the second, and by
  // dWa (GEMM 12) in layer 0's backward, the last one of the step.
  const StackTensor& qkv = t.tensors[1];
  EXPECT_EQ(qkv.name, "qkv");
  EXPECT_EQ(qkv.bytes, 3 * 64 * kMiB);
  EXPECT_EQ(qkv.producer, 0);
  EXPECT_EQ(qkv.ready, 0);
  EXPECT_EQ(qkv.last_forward_reader, 1);
  EXPECT_EQ(qkv.first_backward_reader, 8 * 5 + 7 * 10 + 7);
  EXPECT_EQ(t.kernels[qkv.first_backward_reader].gemm, 12);
  // The input: before the first kernel; read by the qkv GEMM and dWqkv.
  EXPECT_EQ(t.tensors[0].producer, -1);
  EXPECT_EQ(t.tensors[0].readers, (std::vector<int>{0, 8 * 15 - 1}));
  // Without offloading, the simulator's peak is the timeline's.
  const SimResult sim = SimulateSchedule(eight, 0, Ns(kH4096Ms),
                                         55.3, 55.3);
  EXPECT_EQ(NoOffloadPeakBytes(t), sim.peak_bytes);
  EXPECT_EQ(sim.peak_bytes, 8 * 640 * kMiB + 64 * kMiB);
}

TEST_F(StackLimitTest, PushAtLayerMakesTensorsReadyAtTheLayersEnd) {
  Shape s = *shape_;
  s.layers = 2;
  s.push_at = PushAt::kLayer;
  const StackTimeline t = RecordTimeline(s);
  // Layer 1's input (layer 0's output) and its qkv: ready after GEMM 4 of
  // layer 1 (kernel 9).
  EXPECT_EQ(t.tensors[5].name, "y");
  EXPECT_EQ(t.tensors[5].producer, 4);
  EXPECT_EQ(t.tensors[5].ready, 9);
  EXPECT_EQ(t.tensors[6].ready, 9);
}

TEST_F(StackLimitTest, HugeBudgetCostsNothing) {
  const LimitResult r = Limit(int64_t{1} << 40, 55.3);
  ASSERT_TRUE(r.feasible);
  EXPECT_NEAR(r.step_ms, Sum(StackLimitProblem(*timeline_, kH4096Ms,
                                               Link(55.3), 0).kernel_ms),
              1e-9);
  EXPECT_NEAR(r.step_ms, 4 * 17.783, 1e-6);
  // Exactly the no-offload peak is enough too.
  EXPECT_NEAR(Limit(NoOffloadPeakBytes(*timeline_), 55.3).step_ms,
              r.step_ms, 1e-9);
}

TEST_F(StackLimitTest, SlowLinkUnderATightBudgetCostsMore) {
  const int64_t budget = 2 * 640 * kMiB;  // 2 of 4 layers
  const double fast = Limit(budget, 55.3).step_ms;
  const double slow = Limit(budget, 5).step_ms;
  EXPECT_GT(fast, 4 * 17.783 + 1);
  EXPECT_GT(slow, 2 * fast);
}

TEST_F(StackLimitTest, MonotoneInTheBudget) {
  double previous = 1e300;
  for (int64_t mib = 700; mib <= 2800; mib += 300) {
    const LimitResult r = Limit(mib * kMiB, 55.3);
    ASSERT_TRUE(r.feasible) << mib << " MiB";
    EXPECT_LE(r.step_ms, previous + 1e-7) << mib << " MiB";
    previous = r.step_ms;
  }
}

// The engine's own k-of-n schedule is a schedule: on the simulator (the
// same durations, the same link, no latency) it cannot beat the limit at
// the budget it reached (the simulator's device peak: only activations
// and their reloads are allocated there).
TEST_F(StackLimitTest, EngineScheduleIsNeverBelowTheLimit) {
  // Compute-bound (hidden 4096's GEMM times) and copy-bound (half of them,
  // as hidden 2048 with the same bytes).
  for (double scale : {1.0, 0.5}) {
    std::array<double, kGemms> ms = kH4096Ms;
    for (double& v : ms) v = std::round(v * scale * 1e3) / 1e3;
    for (int k = 1; k <= 3; ++k) {
      const SimResult sim = SimulateSchedule(*shape_, k, Ns(ms), 55.3, 55.3);
      const LimitResult r = Solve(
          StackLimitProblem(*timeline_, ms, Link(55.3), sim.peak_bytes));
      ASSERT_TRUE(r.feasible) << "k=" << k;
      EXPECT_LE(r.step_ms, sim.step_ns / 1e6 + 1e-6)
          << "k=" << k << " scale " << scale;
      EXPECT_GE(r.step_ms, r.kernels_ms - 1e-9);
    }
  }
}

// The engine's byte budget counts saved tensors only (SPEC §4.7): the limit
// for that definition gives the tensors it never sees (the last output) no
// bytes; it is at least the limit for all activations at the budget plus
// those bytes (any schedule within the one is within the other), and the
// engine's budget schedule on the simulator is a schedule within it.
TEST_F(StackLimitTest, SavedOnlyLimitBoundsTheEnginesByteBudget) {
  const LimitProblem p =
      StackLimitProblem(*timeline_, kH4096Ms, Link(55.3), 0,
                        BudgetCounts::kSavedOnly);
  ASSERT_EQ(p.tensors.size(), timeline_->tensors.size());
  int unsaved = 0;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const bool saved = timeline_->tensors[i].saved();
    EXPECT_EQ(p.tensors[i].bytes, saved ? timeline_->tensors[i].bytes : 0);
    unsaved += !saved;
  }
  EXPECT_EQ(unsaved, 1);
  const int64_t output = shape_->tokens * shape_->hidden * 2;
  for (double scale : {1.0, 0.5}) {
    std::array<double, kGemms> ms = kH4096Ms;
    for (double& v : ms) v = std::round(v * scale * 1e3) / 1e3;
    for (double b : {1.0, 1.5, 2.0}) {
      const int64_t budget = BudgetForK(*shape_, b);
      const LimitResult saved = Solve(StackLimitProblem(
          *timeline_, ms, Link(55.3), budget, BudgetCounts::kSavedOnly));
      const LimitResult all = Solve(
          StackLimitProblem(*timeline_, ms, Link(55.3), budget + output));
      ASSERT_TRUE(saved.feasible && all.feasible) << b;
      EXPECT_GE(saved.step_ms, all.step_ms - 1e-6) << b << " scale " << scale;
      const SimResult sim = SimulateSchedule(
          *shape_, BenchOptions(*shape_, 0, b, false), Ns(ms), 55.3, 55.3);
      EXPECT_LE(saved.step_ms, sim.step_ns / 1e6 + 1e-6)
          << "budget k" << b << " scale " << scale;
    }
  }
}

TEST(BenchOutputTest, ParsesTheBenchsTables) {
  const std::string text =
      "# layer_stack_bench: NVIDIA H200, layers 8, hidden 2048, tokens "
      "16384, bf16 GEMMs\n"
      "# pushes: --push_at=gemm (each saved tensor)\n\n"
      "## Pinned copy peak (raw cudaMemcpyAsync, GB/s)\n\n"
      "| chunk | D2H alone | H2D alone | D2H (both) | H2D (both) |\n"
      "|---|---|---|---|---|\n"
      "| 16 MiB | 55.0 | 54.9 | 50.2 | 51.6 |\n"
      "| 64 MiB | 55.2 | 55.5 | 50.7 | 50.7 |\n\n"
      "## Per-GEMM compute time (median)\n\n| GEMM | ms |\n|---|---|\n"
      "| fwd qkv | 0.614 |\n| fwd attn | 0.586 |\n| fwd o | 0.209 |\n"
      "| fwd up | 0.844 |\n| fwd down | 0.774 |\n| bwd d_u | 0.825 |\n"
      "| bwd dWdown | 0.761 |\n| bwd d_o | 0.768 |\n| bwd dWup | 0.759 |\n"
      "| bwd d_attn | 0.208 |\n| bwd dWo | 0.194 |\n| bwd d_qkv | 0.601 |\n"
      "| bwd dWa | 0.571 |\n| bwd d_x | 0.580 |\n| bwd dWqkv | 0.571 |\n\n"
      "## Offloading k of 8 layers\n\n"
      "| k | step ms | ratio | act. peak GiB | ratio | D2H GB/s | H2D GB/s "
      "| bound ms | m/b |\n|---|---|---|---|---|---|---|---|---|\n"
      "| 0 | 71.44 | x1.000 | 5.06 | x1.00 | - | - | 70.93 | 1.007 |\n"
      "| 1 | 71.75 | x1.004 | 4.44 | x0.88 | 55.27 | 55.36 | 70.93 | 1.0 |\n";
  StatusOr<BenchOutput> out = ParseBenchOutput(text);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->shape.hidden, 2048);
  EXPECT_EQ(out->shape.tokens, 16384);
  EXPECT_EQ(out->shape.layers, 8);
  EXPECT_EQ(out->shape.push_at, PushAt::kGemm);
  EXPECT_DOUBLE_EQ(out->gemm_ms[0], 0.614);
  EXPECT_DOUBLE_EQ(out->gemm_ms[14], 0.571);
  EXPECT_DOUBLE_EQ(out->bandwidth.d2h, 55.2);
  EXPECT_DOUBLE_EQ(out->bandwidth.h2d, 55.5);
  EXPECT_DOUBLE_EQ(out->bandwidth.both_d2h, 50.7);
  EXPECT_DOUBLE_EQ(out->bandwidth.both_h2d, 51.6);
  ASSERT_EQ(out->rows.size(), 2u);
  EXPECT_DOUBLE_EQ(out->rows[1].step_ms, 71.75);
  EXPECT_DOUBLE_EQ(out->rows[1].peak_gib, 4.44);
  EXPECT_DOUBLE_EQ(out->rows[1].bound_ms, 70.93);
  EXPECT_FALSE(ParseBenchOutput("# nothing\n").ok());
}

}  // namespace
}  // namespace offload::bench
