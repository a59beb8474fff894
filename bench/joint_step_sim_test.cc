// The joint plan (SPEC §4.8) driving the layer-stack benchmark's step
// (layer_stack.h) on the simulator, where copies barely hide behind
// compute: the Offloader's plan mixes recompute and offload where that
// pays, is no slower than the byte budget alone and recomputation alone at
// the same budget, keeps within the budget, and runs without hazards.

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/layer_stack.h"
#include "bench/sim_bound.h"
#include "engine/offload.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_of.h"
#include "gtest/gtest.h"

namespace offload::bench {
namespace {

// 8 layers of 5.2 MB saved; every GEMM takes 1 ms, so a layer's forward
// takes 5 ms and its copy to host 10.5 ms at 0.5 GB/s.
constexpr double kGbps = 0.5;

Shape SmallShape() {
  Shape s;
  s.layers = 8;
  s.hidden = 256;
  s.tokens = 1024;
  return s;
}

std::array<double, kGemms> Millisecond() {
  std::array<double, kGemms> ns;
  ns.fill(1e6);
  return ns;
}

struct Row {
  SimResult sim;
  int recomputed = 0;
  std::string plan;
};

Row RunRow(RowMode mode, double budget_k) {
  Shape s = SmallShape();
  OffloadOptions oo;
  Row row;
  EXPECT_TRUE(RowOptions(s, mode, budget_k, Millisecond(), kGbps, kGbps,
                         false, &oo, &row.plan));
  row.recomputed = RecomputedLayers(s, static_cast<const JointPlan*>(nullptr));
  if (mode == RowMode::kJoint) {
    StatusOr<JointPlan> plan = PlanJoint(JointProblemOf(oo));
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return row;
    row.recomputed = RecomputedLayers(s, &*plan);
    row.plan = FormatJointPlan(*plan, JointProblemOf(oo));
  }
  row.sim = SimulateSchedule(s, oo, Millisecond(), kGbps, kGbps);
  std::printf("%s k=%g: step %.2f ms, peak %lld bytes, recomputed %d, "
              "offloaded %lld bytes, hazards %zu\n%s",
              RowModeName(mode), budget_k, row.sim.step_ns / 1e6,
              static_cast<long long>(row.sim.peak_bytes), row.recomputed,
              static_cast<long long>(row.sim.bytes_offloaded),
              row.sim.hazards, row.plan.c_str());
  return row;
}

// The plan's model is coarser than the engine (joint_plan.h): where it
// picks a mix, it may be up to 1% slower than the byte budget alone.
TEST(JointStepSimTest, NoWorseThanOffloadAloneOrRecomputeAloneWithinBudget) {
  const Shape s = SmallShape();
  const int64_t th = s.tokens * s.hidden * 2;
  for (double k : {2.0, 4.0, 5.0}) {
    SCOPED_TRACE("budget k=" + std::to_string(k));
    const Row budget = RunRow(RowMode::kBudget, k);
    const Row ckpt = RunRow(RowMode::kCheckpoint, k);
    const Row joint = RunRow(RowMode::kJoint, k);
    EXPECT_EQ(joint.sim.hazards, 0u);
    EXPECT_EQ(ckpt.sim.hazards, 0u);
    EXPECT_LE(joint.sim.step_ns, 1.01 * budget.sim.step_ns);
    EXPECT_LE(joint.sim.step_ns, ckpt.sim.step_ns);
    // The budget covers saved and re-created tensors; on top come only the
    // forward's transients: at most u and y of a recomputed layer (5 T*H).
    EXPECT_LE(joint.sim.peak_bytes, BudgetForK(s, k) + 5 * th);
    EXPECT_LE(ckpt.sim.peak_bytes, BudgetForK(s, k) + 5 * th);
  }
}

// The limit of the bench's joint rows (engine/plan/joint_limit.h, printed as
// plan/limit): no choice of the same layers can beat it, so neither the
// plan's own prediction nor the engine's simulated step is below it.
TEST(JointStepSimTest, TheLimitIsBelowThePlanAndTheSimulatedStep) {
  for (double k : {2.0, 4.0, 5.0}) {
    SCOPED_TRACE("budget k=" + std::to_string(k));
    Shape s = SmallShape();
    OffloadOptions oo;
    std::string text;
    ASSERT_TRUE(RowOptions(s, RowMode::kJoint, k, Millisecond(), kGbps, kGbps,
                           false, &oo, &text));
    StatusOr<JointRowLimit> limit = JointRowLimitOf(oo);
    ASSERT_TRUE(limit.ok()) << limit.status();
    const Row joint = RunRow(RowMode::kJoint, k);
    std::printf("k=%g: plan %.3f ms, limit %.3f ms, simulated %.3f ms\n", k,
                limit->plan_ns / 1e6, limit->limit_ns / 1e6,
                joint.sim.step_ns / 1e6);
    EXPECT_GT(limit->limit_ns, 0);
    EXPECT_LE(limit->limit_ns, limit->plan_ns);
    EXPECT_LE(limit->limit_ns, joint.sim.step_ns);
  }
}

// At 3 layers' budget neither alone is enough: the plan offloads and
// recomputes, and is faster than either alone.
TEST(JointStepSimTest, TightBudgetMixesAndBeatsBoth) {
  const Row budget = RunRow(RowMode::kBudget, 5);
  const Row ckpt = RunRow(RowMode::kCheckpoint, 5);
  const Row joint = RunRow(RowMode::kJoint, 5);
  EXPECT_GT(joint.recomputed, 0);
  EXPECT_GT(joint.sim.bytes_offloaded, 0);
  EXPECT_LT(joint.sim.step_ns, budget.sim.step_ns);
  EXPECT_LT(joint.sim.step_ns, ckpt.sim.step_ns);
}

}  // namespace
}  // namespace offload::bench
