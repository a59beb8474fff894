#include "engine/schedule.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

ScheduleEntry Entry(bool offload_fwd, int offload_num, bool reload_fwd,
                    int reload_num) {
  return ScheduleEntry{offload_fwd, offload_num, reload_fwd, reload_num};
}

TEST(ScheduleStepTest, ForwardStepsComeFirstThenBackward) {
  EXPECT_EQ(ScheduleStep(5, true, 1), 1);
  EXPECT_EQ(ScheduleStep(5, true, 5), 5);
  EXPECT_EQ(ScheduleStep(5, false, 1), 6);
  EXPECT_EQ(ScheduleStep(5, false, 5), 10);
}

// SPEC §4.1 with n = 5, k = 2: layer 0 is released before the forward of
// layer n-k+0 = 3, i.e. once 4 layers have begun their forward, and reloaded
// when the backward of layer n-1-k+0 = 2 begins (3 backwards begun); layer 1
// is released before layer 4's forward (5 forwards) and reloaded when layer
// 3's backward begins (2 backwards).
TEST(DefaultScheduleTest, FiveLayersTwoOffloaded) {
  ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(5, 2));
  EXPECT_THAT(table, ElementsAre(Pair(0, Entry(true, 4, false, 3)),
                                 Pair(1, Entry(true, 5, false, 2))));
}

TEST(DefaultScheduleTest, OffloadsTheFirstKLayers) {
  ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(8, 3));
  ASSERT_EQ(table.size(), 3u);
  EXPECT_TRUE(table.contains(0));
  EXPECT_TRUE(table.contains(1));
  EXPECT_TRUE(table.contains(2));
  EXPECT_FALSE(table.contains(3));
}

// k == n-1: layer i is released when layer i+1 begins its forward, and
// reloaded when layer i+1's backward begins: only one layer resident.
TEST(DefaultScheduleTest, AllButOneLayerOffloaded) {
  ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(3, 2));
  EXPECT_THAT(table, ElementsAre(Pair(0, Entry(true, 2, false, 3)),
                                 Pair(1, Entry(true, 3, false, 2))));
}

TEST(DefaultScheduleTest, NoOffloadedLayersGivesAnEmptyTable) {
  ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(5, 0));
  EXPECT_THAT(table, IsEmpty());
  ASSERT_OK_AND_ASSIGN(ScheduleTable single, DefaultSchedule(1, 0));
  EXPECT_THAT(single, IsEmpty());
}

TEST(DefaultScheduleTest, RejectsMoreThanAllButOneLayer) {
  EXPECT_THAT(DefaultSchedule(5, 5),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("4")));
  EXPECT_THAT(DefaultSchedule(5, 6), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(DefaultSchedule(1, 1), StatusIs(StatusCode::kInvalidArgument));
}

TEST(DefaultScheduleTest, RejectsNegativeCount) {
  EXPECT_THAT(DefaultSchedule(5, -1), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ValidateScheduleTest, AcceptsEmptyTable) {
  EXPECT_OK(ValidateSchedule({}, 1));
  EXPECT_OK(ValidateSchedule({}, 7));
}

TEST(ValidateScheduleTest, AcceptsTheDefaultTables) {
  for (int n = 1; n <= 8; ++n) {
    for (int k = 0; k < n; ++k) {
      ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(n, k));
      EXPECT_OK(ValidateSchedule(table, n)) << "n=" << n << " k=" << k;
    }
  }
}

TEST(ValidateScheduleTest, AcceptsReloadDuringForward) {
  // Design doc style: layer 0 released when layer 2 begins forward, reloaded
  // as soon as layer 3 begins forward (prefetch ahead of the backward).
  ScheduleTable table = {{0, Entry(true, 3, true, 4)}};
  EXPECT_OK(ValidateSchedule(table, 4));
}

TEST(ValidateScheduleTest, AcceptsReloadAtTheReleaseStepAndAtOwnBackward) {
  // n = 4, layer 1: own forward step 2, own backward step 4 + 3 = 7.
  EXPECT_OK(ValidateSchedule({{1, Entry(true, 3, true, 3)}}, 4));
  EXPECT_OK(ValidateSchedule({{1, Entry(true, 3, false, 3)}}, 4));
}

TEST(ValidateScheduleTest, AcceptsReleaseDuringBackward) {
  // Released only when the backward begins (pipeline style), reloaded later.
  EXPECT_OK(ValidateSchedule({{0, Entry(false, 1, false, 2)}}, 3));
}

TEST(ValidateScheduleTest, RejectsLayerIdsOutOfRange) {
  EXPECT_THAT(ValidateSchedule({{4, Entry(true, 4, false, 1)}}, 4),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 4"), HasSubstr("4 layers"))));
  EXPECT_THAT(ValidateSchedule({{-1, Entry(true, 2, false, 2)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer -1")));
}

TEST(ValidateScheduleTest, RejectsZeroCounts) {
  EXPECT_THAT(ValidateSchedule({{0, Entry(true, 0, false, 2)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 0")));
  EXPECT_THAT(ValidateSchedule({{0, Entry(true, 2, false, 0)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 0")));
}

TEST(ValidateScheduleTest, RejectsCountsAboveTheLayerCount) {
  EXPECT_THAT(ValidateSchedule({{0, Entry(true, 5, false, 2)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 0")));
  EXPECT_THAT(ValidateSchedule({{1, Entry(true, 3, false, 5)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 1")));
}

TEST(ValidateScheduleTest, RejectsReleaseBeforeOwnForward) {
  // Layer 2 begins its forward at step 3; releasing at step 2 is too early.
  EXPECT_THAT(ValidateSchedule({{2, Entry(true, 2, false, 1)}}, 4),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 2"), HasSubstr("forward"))));
}

TEST(ValidateScheduleTest, RejectsReleaseAtOwnForward) {
  // Releasing the moment its own forward begins leaves no activations.
  EXPECT_THAT(ValidateSchedule({{2, Entry(true, 3, false, 1)}}, 4),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 2"), HasSubstr("forward"))));
}

TEST(ValidateScheduleTest, RejectsReloadBeforeRelease) {
  // Release at backward step 2 (= step 6), reload at forward step 4.
  EXPECT_THAT(ValidateSchedule({{0, Entry(false, 2, true, 4)}}, 4),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 0"), HasSubstr("reload"))));
  // Both in forward: release at 3, reload at 2.
  EXPECT_THAT(ValidateSchedule({{0, Entry(true, 3, true, 2)}}, 4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 0")));
}

TEST(ValidateScheduleTest, RejectsReloadAfterOwnBackward) {
  // n = 4, layer 2's backward begins at step 4 + 2 = 6; reloading at the
  // third backward (step 7) would be too late.
  EXPECT_THAT(ValidateSchedule({{2, Entry(true, 4, false, 3)}}, 4),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 2"), HasSubstr("backward"))));
}

TEST(ValidateScheduleTest, ReportsTheOffendingLayerAmongValidOnes) {
  ASSERT_OK_AND_ASSIGN(ScheduleTable table, DefaultSchedule(6, 3));
  table[4] = Entry(true, 6, false, 4);  // layer 4's backward is step 8
  EXPECT_THAT(ValidateSchedule(table, 6),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 4")));
}

// Default tables are valid for every (n, k) and follow SPEC §4.1 exactly:
// layer i is released at the forward of layer n-k+i, reloaded at the backward
// of layer n-1-k+i, and at every step at most n-k layers are resident.
RC_GTEST_PROP(DefaultScheduleProperty, IsValidAndKeepsAtMostNMinusKResident,
              ()) {
  const int n = *rc::gen::inRange(1, 17);
  const int k = *rc::gen::inRange(0, n);
  StatusOr<ScheduleTable> table = DefaultSchedule(n, k);
  RC_ASSERT(table.ok());
  RC_ASSERT(ValidateSchedule(*table, n).ok());
  RC_ASSERT(static_cast<int>(table->size()) == k);
  for (const auto& [layer, entry] : *table) {
    RC_ASSERT(layer >= 0 && layer < k);
    RC_ASSERT(entry.offload_fwd);
    RC_ASSERT(!entry.reload_fwd);
    // Released when layer n-k+layer begins forward (step n-k+layer+1).
    RC_ASSERT(entry.offload_num == n - k + layer + 1);
    // Reloaded when layer n-1-k+layer begins backward; backward of layer j
    // is the (n-j)-th backward.
    RC_ASSERT(entry.reload_num == n - (n - 1 - k + layer));
  }
  // Residency: a layer is resident from its forward until released, and
  // again from its reload on; layers leave at the end of their backward.
  // After step s of the forward at most n-k layers hold activations.
  for (int step = 1; step <= 2 * n; ++step) {
    int resident = 0;
    for (int layer = 0; layer < n; ++layer) {
      int forward = ScheduleStep(n, true, layer + 1);
      int backward_done = ScheduleStep(n, false, n - layer) + 1;
      if (step < forward || step >= backward_done) continue;
      auto it = table->find(layer);
      if (it == table->end()) {
        ++resident;
        continue;
      }
      int release = ScheduleStep(n, it->second.offload_fwd,
                                 it->second.offload_num);
      int reload =
          ScheduleStep(n, it->second.reload_fwd, it->second.reload_num);
      if (step < release || step >= reload) ++resident;
    }
    RC_ASSERT(resident <= n - k);
  }
}

RC_GTEST_PROP(DefaultScheduleProperty, RejectsAllLayersOrMore, ()) {
  const int n = *rc::gen::inRange(1, 17);
  const int k = *rc::gen::inRange(n, n + 5);
  RC_ASSERT(DefaultSchedule(n, k).status().code() ==
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload
