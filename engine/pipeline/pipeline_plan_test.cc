// The fine-grained mode's pure policy: backward chunk order (SPEC §5.2) and
// the warm-up freeze (§5.4), including upstream defect (g).

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/pipeline/chunk_order.h"
#include "engine/pipeline/freeze_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::ElementsAre;

std::vector<ChunkId> Backward(const std::vector<ChunkId>& forward,
                              int stages) {
  ChunkOrder order(stages);
  for (size_t i = 0; i < forward.size(); ++i) {
    order.AddForward(static_cast<int>(i), forward[i].stage);
  }
  EXPECT_THAT(order.CheckComplete(), IsOk());
  std::vector<ChunkId> out;
  for (int index : order.backward()) out.push_back(forward[index]);
  return out;
}

TEST(ChunkOrderTest, SpecExampleTwoStagesFourMicrobatches) {
  const std::vector<ChunkId> forward = {{0, 0}, {0, 1}, {1, 0}, {1, 1},
                                        {0, 2}, {0, 3}, {1, 2}, {1, 3}};
  EXPECT_THAT(Backward(forward, 2),
              ElementsAre(ChunkId{1, 0}, ChunkId{1, 1}, ChunkId{0, 0},
                          ChunkId{0, 1}, ChunkId{1, 2}, ChunkId{1, 3},
                          ChunkId{0, 2}, ChunkId{0, 3}));
}

TEST(ChunkOrderTest, OneStageRunsBackwardInForwardOrder) {
  const std::vector<ChunkId> forward = {{0, 0}, {0, 1}, {0, 2}};
  EXPECT_THAT(Backward(forward, 1),
              ElementsAre(ChunkId{0, 0}, ChunkId{0, 1}, ChunkId{0, 2}));
}

TEST(ChunkOrderTest, ThreeStagesAppendMiddleThenFirst) {
  const std::vector<ChunkId> forward = {{0, 0}, {1, 0}, {2, 0}};
  EXPECT_THAT(Backward(forward, 3),
              ElementsAre(ChunkId{2, 0}, ChunkId{1, 0}, ChunkId{0, 0}));
}

TEST(ChunkOrderTest, UnequalStageCountsAreAnError) {
  ChunkOrder order(2);
  order.AddForward(0, 0);
  order.AddForward(1, 0);
  order.AddForward(2, 1);
  EXPECT_THAT(order.CheckComplete(),
              StatusIs(StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("virtual stage 1 ran 1")));
}

// SPEC §5.8g: the fraction's floor is exact. Upstream's int(n * (1 - f))
// gives 0, 1, 0 for these.
TEST(FreezePlanTest, FractionFloorIsExact) {
  EXPECT_EQ(FractionKeptOnDevice(5, 0.8), 1);
  EXPECT_EQ(FractionKeptOnDevice(10, 0.8), 2);
  EXPECT_EQ(FractionKeptOnDevice(10, 0.9), 1);
  EXPECT_EQ(FractionKeptOnDevice(7, 1.0), 0);
  EXPECT_EQ(FractionKeptOnDevice(7, 0.0), 7);
  EXPECT_EQ(FractionKeptOnDevice(3, 0.5), 1);
}

RecordedChunk Chunk(ChunkId id, const std::vector<std::string>& names,
                    int64_t bytes) {
  RecordedChunk chunk{id, {}};
  std::map<std::string, int> ordinal;
  for (const std::string& name : names) {
    chunk.groups.push_back(
        RecordedGroup{name, ordinal[name]++, true, bytes, 0});
  }
  return chunk;
}

// Upstream test: of two same-name groups, the margin keeps only the last
// of the earliest backward chunk; the other is offloaded.
TEST(FreezePlanTest, MarginKeepsTheLastOfEachNameInTheFirstBackwardChunk) {
  const std::vector<RecordedChunk> chunks = {
      Chunk({0, 0}, {"core_attn", "core_attn"}, 100),
      Chunk({0, 1}, {"core_attn", "core_attn"}, 100)};
  FrozenPlan plan = FreezePlan(chunks, {0, 1}, FreezeOptions{});
  EXPECT_THAT(plan.decision[0],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kMargin));
  EXPECT_THAT(plan.decision[1],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kOffload));
  // The earliest *backward* chunk, not the first forward one.
  plan = FreezePlan(chunks, {1, 0}, FreezeOptions{});
  EXPECT_THAT(plan.decision[1],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kMargin));
  EXPECT_THAT(plan.decision[0],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kOffload));
}

TEST(FreezePlanTest, RankDeltaKeepsWholeGroupsInBackwardOrder) {
  const std::vector<RecordedChunk> chunks = {
      Chunk({0, 0}, {"a", "b", "c", "d"}, 100),
      Chunk({0, 1}, {"a", "b", "c", "d"}, 100)};
  // Rank 2 × 75 B = 150 B: two groups of 100 B (at most one over), in
  // backward order (chunk 1 first), forward order inside it. The margin
  // already kept chunk 1's last of every name (all four names).
  FrozenPlan plan =
      FreezePlan(chunks, {1, 0}, FreezeOptions{2, 75, 1.0});
  EXPECT_THAT(plan.decision[1],
              ElementsAre(GroupDecision::kMargin, GroupDecision::kMargin,
                          GroupDecision::kMargin, GroupDecision::kMargin));
  EXPECT_THAT(plan.decision[0],
              ElementsAre(GroupDecision::kRankDelta, GroupDecision::kRankDelta,
                          GroupDecision::kOffload, GroupDecision::kOffload));
}

// A rank × delta beyond int64 (issue 21: UB, and a wrapped negative amount
// kept nothing) saturates: every offloaded group stays on device.
TEST(FreezePlanTest, RankDeltaBeyondInt64Saturates) {
  const std::vector<RecordedChunk> chunks = {
      Chunk({0, 0}, {"a", "b"}, 100), Chunk({0, 1}, {"a", "b"}, 100)};
  FrozenPlan plan = FreezePlan(
      chunks, {1, 0},
      FreezeOptions{7, std::numeric_limits<int64_t>::max() / 2, 1.0});
  EXPECT_THAT(plan.decision[0],
              ElementsAre(GroupDecision::kRankDelta, GroupDecision::kRankDelta));
}

TEST(FreezePlanTest, FractionKeepsTheLatestGroupsOfEachChunk) {
  RecordedChunk first = Chunk({0, 0}, {"x", "x", "x", "x", "x", "x"}, 10);
  RecordedChunk second = Chunk({0, 1}, {"x", "x", "x", "x", "x", "x"}, 10);
  second.groups[2].bytes = 0;  // copied nothing: not eligible
  FrozenPlan plan =
      FreezePlan({first, second}, {0, 1}, FreezeOptions{0, 0, 0.8});
  // Chunk 0: margin keeps #5; of the 5 left, floor(5 × 0.2) = 1 stays (#4).
  EXPECT_THAT(plan.decision[0],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kOffload,
                          GroupDecision::kOffload, GroupDecision::kOffload,
                          GroupDecision::kFraction, GroupDecision::kMargin));
  // Chunk 1: 5 eligible (one copied nothing), 1 stays: the latest.
  EXPECT_THAT(plan.decision[1],
              ElementsAre(GroupDecision::kOffload, GroupDecision::kOffload,
                          GroupDecision::kNotEligible, GroupDecision::kOffload,
                          GroupDecision::kOffload, GroupDecision::kFraction));
}

TEST(FreezePlanTest, SummaryCountsOffloadedBytesPerName) {
  RecordedChunk chunk = Chunk({0, 0}, {"qkv", "attn", "qkv", "attn"}, 1000);
  chunk.groups[0].caller_held_bytes = 1000;
  const std::vector<RecordedChunk> chunks = {chunk};
  FrozenPlan plan = FreezePlan(chunks, {0}, FreezeOptions{});
  OffloadSummary summary = Summarize(chunks, plan, 3);
  EXPECT_EQ(summary.pipeline_rank, 3);
  ASSERT_EQ(summary.names.size(), 2u);
  EXPECT_EQ(summary.names[0].name, "qkv");
  EXPECT_EQ(summary.names[0].groups, 2);
  EXPECT_EQ(summary.names[0].offloaded_groups, 1);  // margin kept #1
  EXPECT_EQ(summary.names[0].offloaded_bytes, 1000);
  EXPECT_EQ(summary.names[0].caller_held_bytes, 1000);
  EXPECT_EQ(summary.offloaded_bytes, 2000);
  const std::string table = FormatSummaryTable({summary});
  EXPECT_THAT(table, ::testing::HasSubstr("qkv"));
  EXPECT_THAT(table, ::testing::HasSubstr("|       3 |"));
  EXPECT_THAT(table, ::testing::HasSubstr("0.00"));
}

}  // namespace
}  // namespace offload
