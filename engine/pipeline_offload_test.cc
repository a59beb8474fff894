// The fine-grained front door's calls (engine/pipeline_offload.h): the
// in-flight cap (SPEC §5.6), errors that name the chunk and group and change
// nothing, and a workload that changes after the freeze (§5.4).

#include "engine/pipeline_offload.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/offload_test_util.h"
#include "testing/pipeline_test_util.h"
#include "testing/saved_tensor_forge.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using offload_test::KernelNamed;
using offload_test::MovesInto;
using pipeline_test::Modules;
using offload_test::TraceTime;

class PipelineOffloadTest : public pipeline_test::SimPipelineTest {
 protected:
  // A compute kernel named `name` (what the model runs next).
  void Kernel(const std::string& name) {
    SimKernel kernel;
    kernel.name = name;
    kernel.duration_ns = 1000;
    ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(), kernel));
  }
  // Runs one chunk's backward over `names` (reverse commit order given).
  void Backward(int microbatch, const std::vector<std::string>& names) {
    ASSERT_OK(off_->StartChunkBackward(0, microbatch));
    for (const std::string& name : names) {
      ASSERT_OK(off_->GroupBackwardStart(name));
      ASSERT_OK(off_->GroupBackwardEnd(name));
    }
  }
  std::string States() const {
    std::string out;
    for (int mb = 0; mb < 2; ++mb) {
      for (const char* name : {"a", "b"}) {
        out += std::string(GroupStateName(off_->state(0, mb, name, 0))) + " ";
      }
    }
    return out + "offloaded " +
           std::to_string(off_->stats().bytes_offloaded) + " reloaded " +
           std::to_string(off_->stats().bytes_reloaded);
  }

};

// Options whose rank × delta does not fit in int64 are refused at Create
// (issue 21: the freeze computed it with signed overflow).
TEST_F(PipelineOffloadTest, RankTimesDeltaMustFitInInt64) {
  SimBackend sim{SimOptions{}};
  PipelineOffloadOptions options = Modules({"a"});
  options.pipeline_rank = 7;
  options.delta_offload_bytes = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THAT(PipelineOffloader::Create(sim, options).status(),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("does not fit in int64")));
  options.delta_offload_bytes = std::numeric_limits<int64_t>::max() / 7;
  EXPECT_OK(PipelineOffloader::Create(sim, options).status());
  options.pipeline_rank = 0;
  options.delta_offload_bytes = std::numeric_limits<int64_t>::max();
  EXPECT_OK(PipelineOffloader::Create(sim, options).status());
}

// A handle whose group or index is out of range (forged, or corrupted) is
// an error, never an out-of-bounds read; the real handle still pops.
TEST_F(PipelineOffloadTest, ForgedHandleFieldsAreRangeChecked) {
  Make(Modules({"a"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  const SavedTensor real = Group("a", 1);
  ASSERT_TRUE(real.in_group());
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("a"));
  for (SavedTensor::InGroup bad :
       {SavedTensor::InGroup{7, 0}, SavedTensor::InGroup{-1, 0},
        SavedTensor::InGroup{0, 5}, SavedTensor::InGroup{0, -2}}) {
    EXPECT_THAT(off_->Pop(SavedTensorForge::Like(real, bad)),
                StatusIs(StatusCode::kInvalidArgument))
        << bad.group << "/" << bad.index;
  }
  PopAndCheck(real, 1);
  ASSERT_OK(off_->GroupBackwardEnd("a"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// §5.6: with max_inflight 0 the compute stream waits for each offload right
// after its commit; with 1, for the older of two; unset, never.
TEST_F(PipelineOffloadTest, InflightCapMakesComputeWaitForTheOldestOffload) {
  SimOptions slow;
  slow.d2h_gbps = 0.001;  // 16 KiB: about 16 ms
  for (int cap : {-1, 0, 1}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    PipelineOffloadOptions options = Modules({"a"});
    if (cap >= 0) options.max_inflight["a"] = cap;
    Make(options, slow);
    ASSERT_OK(off_->StartChunk(0, 0));
    Group("a", 1);
    Kernel("after first");
    Group("a", 2);
    Kernel("after second");
    sim_->RunUntilIdle();
    const int64_t first_copy_end = TraceTime(
        *sim_, SimPhase::kEnd, MovesInto(MemorySpace::kPinnedHost));
    ASSERT_GT(first_copy_end, 0);
    const int64_t after_first =
        TraceTime(*sim_, SimPhase::kStart, KernelNamed("after first"));
    const int64_t after_second =
        TraceTime(*sim_, SimPhase::kStart, KernelNamed("after second"));
    EXPECT_EQ(after_first >= first_copy_end, cap == 0);
    EXPECT_EQ(after_second >= first_copy_end, cap == 0 || cap == 1);
    Backward(0, {"a", "a"});
    ASSERT_OK(off_->FinishIteration());
    sim_->RunUntilIdle();
    EXPECT_THAT(sim_->hazards(), ::testing::IsEmpty());
  }
}

// Calls out of order name what is wrong and change nothing.
TEST_F(PipelineOffloadTest, CallsOutOfOrderAreClearErrorsThatChangeNothing) {
  Make(Modules({"a"}));
  EXPECT_THAT(off_->GroupStart("a"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("no chunk's forward is running")));
  EXPECT_THAT(off_->StartChunk(1, 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("stage")));
  ASSERT_OK(off_->StartChunk(0, 0));
  Group("a", 1);
  Group("b", 2);
  EXPECT_THAT(off_->GroupCommit("a"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("no open group of that name")));
  ASSERT_OK(off_->GroupStart("a"));
  EXPECT_THAT(off_->StartChunk(0, 1),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("group 'a' #1 of chunk (stage 0, "
                                 "microbatch 0) in iteration 1 is still "
                                 "open")));
  EXPECT_THAT(off_->StartChunk(0, 0),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("already ran")));
  ASSERT_OK(off_->GroupCommit("a"));
  ASSERT_OK(off_->StartChunk(0, 1));
  Group("a", 3);
  const std::string before = States();
  EXPECT_THAT(off_->StartChunkBackward(0, 1),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("the next chunk in backward order (SPEC "
                                 "§5.2) is chunk (stage 0, microbatch 0)")));
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  EXPECT_THAT(off_->GroupBackwardStart("b"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("the next group in reverse commit order is "
                                 "group 'a' #1")));
  EXPECT_THAT(off_->GroupBackwardEnd("a"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("no group of that name is in its backward")));
  EXPECT_THAT(off_->FinishIteration(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("did not end")));
  EXPECT_EQ(States(), before);
  EXPECT_THAT(off_->StartChunkBackward(0, 1),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("has groups that did not end")));
}

// §5.4: after the freeze, the workload must repeat; a change is a clear
// error naming what warm-up ran there, and changes nothing.
TEST_F(PipelineOffloadTest, AWorkloadThatChangesAfterTheFreezeIsAnError) {
  Make(Modules({"a"}));
  for (int mb = 0; mb < 2; ++mb) {
    ASSERT_OK(off_->StartChunk(0, mb));
    Group("a", 10 + mb);
    Group("b", 20 + mb);
  }
  Backward(0, {"b", "a"});
  Backward(1, {"b", "a"});
  ASSERT_OK(off_->FinishIteration());
  ASSERT_TRUE(off_->warmed_up());
  const std::string frozen = States();
  EXPECT_THAT(off_->StartChunk(0, 1),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("the workload changed after the warm-up: "
                                 "chunk #0 was chunk (stage 0, microbatch 0)")));
  EXPECT_EQ(States(), frozen);
  ASSERT_OK(off_->StartChunk(0, 0));
  EXPECT_THAT(off_->GroupStart("b"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("group #0 was 'a' of chunk #0")));
  Group("a", 30);
  // The chunk ran one group instead of two: caught at the next chunk, and
  // at its backward.
  EXPECT_THAT(off_->StartChunk(0, 1),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("chunk (stage 0, microbatch 0) ran 1 groups, "
                                 "warm-up ran 2")));
  EXPECT_THAT(off_->StartChunkBackward(0, 0),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("ran 1 groups, warm-up ran 2")));
}

}  // namespace
}  // namespace offload
