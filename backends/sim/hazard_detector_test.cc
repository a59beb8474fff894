#include "backends/sim/hazard_detector.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Two agents (components 1 and 2) stamping operations by hand.
class HazardDetectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AccessOp alloc = Op(a_, 1, "alloc");
    detector_.OnAllocate(/*block=*/7, "device#7", alloc);
    b_.Join(a_);  // b is ordered after the allocation
  }

  AccessOp Op(VectorClock& clock, size_t component, const std::string& name) {
    return AccessOp{clock.Tick(component), name};
  }

  std::vector<HazardKind> Kinds() const {
    std::vector<HazardKind> kinds;
    for (const Hazard& h : detector_.hazards()) kinds.push_back(h.kind);
    return kinds;
  }

  HazardDetector detector_;
  VectorClock a_, b_;
};

TEST_F(HazardDetectorTest, ConcurrentReadsNeverConflict) {
  detector_.OnRead(7, 0, 100, Op(a_, 1, "read-a"), a_);
  detector_.OnRead(7, 0, 100, Op(b_, 2, "read-b"), b_);
  EXPECT_THAT(detector_.hazards(), IsEmpty());
}

TEST_F(HazardDetectorTest, DisjointRangesNeverConflict) {
  detector_.OnWrite(7, 0, 50, Op(a_, 1, "write-a"), a_);
  detector_.OnWrite(7, 50, 100, Op(b_, 2, "write-b"), b_);
  EXPECT_THAT(detector_.hazards(), IsEmpty());
}

TEST_F(HazardDetectorTest, UnorderedConflictsAreNamedByKind) {
  detector_.OnWrite(7, 0, 100, Op(a_, 1, "write-a"), a_);
  detector_.OnRead(7, 90, 200, Op(b_, 2, "read-b"), b_);
  detector_.OnWrite(7, 0, 10, Op(b_, 2, "write-b"), b_);
  EXPECT_THAT(Kinds(), ElementsAre(HazardKind::kReadBeforeWrite,
                                   HazardKind::kWriteAfterWrite));
  const Hazard& first = detector_.hazards()[0];
  EXPECT_EQ(first.earlier, "write-a");
  EXPECT_EQ(first.later, "read-b");
  EXPECT_EQ(first.memory, "device#7 bytes [90, 100)");
  EXPECT_EQ(first.ToString(),
            "read-before-write: read-b vs write-a on device#7 bytes [90, 100)");
}

TEST_F(HazardDetectorTest, JoiningTheWritersClockOrdersTheRead) {
  detector_.OnWrite(7, 0, 100, Op(a_, 1, "write-a"), a_);
  b_.Join(a_);  // b waited for an event recorded after the write
  detector_.OnRead(7, 0, 100, Op(b_, 2, "read-b"), b_);
  EXPECT_THAT(detector_.hazards(), IsEmpty());
}

TEST_F(HazardDetectorTest, PruningKeepsLaterConflictsVisible) {
  // a writes, b reads after it, then a overwrites without waiting for b.
  detector_.OnWrite(7, 0, 100, Op(a_, 1, "write-a"), a_);
  b_.Join(a_);
  detector_.OnRead(7, 0, 100, Op(b_, 2, "read-b"), b_);
  detector_.OnWrite(7, 0, 100, Op(a_, 1, "overwrite-a"), a_);
  ASSERT_THAT(Kinds(), ElementsAre(HazardKind::kWriteDuringRead));
  EXPECT_EQ(detector_.hazards()[0].earlier, "read-b");
}

TEST_F(HazardDetectorTest, FreeChecksEveryAccessAndLaterUseIsAfterFree) {
  detector_.OnRead(7, 0, 100, Op(b_, 2, "read-b"), b_);
  detector_.OnFree(7, Op(a_, 1, "free-a"), a_);  // not ordered after read-b
  detector_.OnRead(7, 0, 1, Op(a_, 1, "late-read"), a_);
  EXPECT_THAT(Kinds(), ElementsAre(HazardKind::kFreeDuringUse,
                                   HazardKind::kUseAfterFree));
  EXPECT_EQ(detector_.hazards()[1].earlier, "free-a");
}

TEST_F(HazardDetectorTest, UseNotOrderedAfterTheAllocation) {
  VectorClock stranger;
  detector_.OnWrite(7, 0, 1, Op(stranger, 3, "early"), stranger);
  EXPECT_THAT(Kinds(), ElementsAre(HazardKind::kUseBeforeAllocation));
}

}  // namespace
}  // namespace offload
