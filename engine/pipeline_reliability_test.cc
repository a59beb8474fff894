// The fine-grained front door's reliability rules (issue 21): a chunk's
// forward ends when any other chunk starts (SPEC §5.3: in 1F1B the next
// chunk is pre-reloaded at the end of the previous backward), and a forced
// release (release_tensors) never frees a storage another live handle still
// reads, so no Pop hands back a tensor without memory. Same fixture as
// pipeline_defects_test.cc.

#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/offload_test_util.h"
#include "testing/pipeline_test_util.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using offload_test::HostBytes;
using pipeline_test::kElements;
using pipeline_test::Modules;

class PipelineReliabilityTest : public pipeline_test::SimPipelineTest {};

// SPEC §5.3: a rank runs one chunk at a time, so a chunk's forward has
// finished as soon as another chunk starts, forward or backward. In plain
// 1F1B (F0 F1 B0 B1; and F0 F1 B0 F2 B1) chunk 1 is pre-reloaded at the end
// of B0, not when its own backward begins.
TEST_F(PipelineReliabilityTest, OneFOneBPreReloadsTheNextChunkAtTheEndOfB0) {
  for (bool third : {false, true}) {
    SCOPED_TRACE(third ? "F0 F1 B0 F2 B1 B2" : "F0 F1 B0 B1");
    Make(Modules({"core_attn"}));
    for (int iteration = 0; iteration < 2; ++iteration) {  // warm-up, frozen
      ASSERT_OK(off_->StartChunk(0, 0));
      SavedTensor s0 = Group("core_attn", 1);
      ASSERT_OK(off_->StartChunk(0, 1));
      SavedTensor s1 = Group("core_attn", 2);
      ASSERT_OK(off_->StartChunkBackward(0, 0));
      ASSERT_OK(off_->GroupBackwardStart("core_attn"));
      PopAndCheck(s0, 1);
      EXPECT_EQ(off_->state(0, 1, "core_attn", 0),
                GroupState::kOffloadFinished);
      ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
      EXPECT_EQ(off_->state(0, 1, "core_attn", 0),
                GroupState::kReloadStarted);
      SavedTensor s2;
      if (third) {
        ASSERT_OK(off_->StartChunk(0, 2));
        s2 = Group("core_attn", 3);
      }
      ASSERT_OK(off_->StartChunkBackward(0, 1));
      ASSERT_OK(off_->GroupBackwardStart("core_attn"));
      PopAndCheck(s1, 2);
      ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
      if (third) {
        ASSERT_OK(off_->StartChunkBackward(0, 2));
        ASSERT_OK(off_->GroupBackwardStart("core_attn"));
        PopAndCheck(s2, 3);
        ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
      }
      ASSERT_OK(off_->FinishIteration());
    }
    ExpectClean();
  }
}

// A chunk's forward cannot end with a group open: StartChunkBackward of
// another chunk is then refused, naming the group, and changes nothing.
TEST_F(PipelineReliabilityTest, BackwardOfAnotherChunkWhileAGroupIsOpenIsRefused) {
  Make(Modules({"core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  SavedTensor s0 = Group("core_attn", 1);
  ASSERT_OK(off_->StartChunk(0, 1));
  ASSERT_OK(off_->GroupStart("core_attn"));
  EXPECT_THAT(off_->StartChunkBackward(0, 0),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("is still open")));
  EXPECT_EQ(off_->state(0, 0, "core_attn", 0), GroupState::kOffloadFinished);
  ASSERT_OK_AND_ASSIGN(SavedTensor s1, off_->Push(New(2)));
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(s0, 1);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->StartChunkBackward(0, 1));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(s1, 2);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// release_tensors never frees a storage another live handle still reads
// (issue 21, item 3): x is kept on device by a group that is not
// offloaded, by a small view kept as is, and by a group that stayed on
// device; a later group copies x and names it in release_tensors. Each
// holder's Pop hands back x's bytes, never a tensor without memory.
TEST_F(PipelineReliabilityTest, ForcedReleaseSparesStoragesOtherHandlesHold) {
  for (int holder = 0; holder < 3; ++holder) {
    SCOPED_TRACE("holder " + std::to_string(holder));
    SimOptions no_pinned;
    if (holder == 2) no_pinned.pinned_capacity_bytes = kElements * 4;
    Make(Modules({"core_attn", "mlp"}), no_pinned);
    ASSERT_OK(off_->StartChunk(0, 0));
    Tensor x = New(1);
    const char* holder_group = holder == 0 ? "attn_norm" : "core_attn";
    ASSERT_OK(off_->GroupStart(holder_group));
    Tensor held = x;
    if (holder == 1) {  // a 16-element view: below the offload minimum
      held.shape = {16};
      held.strides = {1};
    }
    if (holder == 2) {  // fills the pinned memory: this group stays on device
      ASSERT_OK_AND_ASSIGN(SavedTensor filler, off_->Push(New(2)));
      (void)filler;
    }
    ASSERT_OK_AND_ASSIGN(SavedTensor saved_held, off_->Push(held));
    ASSERT_OK(off_->GroupCommit(holder_group, {}));
    if (holder == 2) {
      EXPECT_EQ(off_->state(0, 0, "core_attn", 0),
                GroupState::kKeptOnDevice);
    }
    ASSERT_OK(off_->GroupStart("mlp"));
    ASSERT_OK_AND_ASSIGN(SavedTensor saved_x, off_->Push(x));
    ASSERT_OK(off_->GroupCommit("mlp", {x}));
    ASSERT_NE(x.storage->data(), nullptr);
    EXPECT_THAT(off_->diagnostics().warnings().back(),
                HasSubstr("another handle still reads it"));
    x = Tensor();
    ASSERT_OK(off_->StartChunkBackward(0, 0));
    ASSERT_OK(off_->GroupBackwardStart("mlp"));
    PopAndCheck(saved_x, 1);
    ASSERT_OK(off_->GroupBackwardEnd("mlp"));
    ASSERT_OK(off_->GroupBackwardStart(holder_group));
    ASSERT_OK_AND_ASSIGN(Tensor back, off_->Pop(saved_held));
    ASSERT_NE(back.storage, nullptr);
    ASSERT_NE(back.storage->data(), nullptr);
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, back));
    EXPECT_EQ(bytes, PatternTensorBytes(held, 1));
    back = Tensor();
    ASSERT_OK(off_->GroupBackwardEnd(holder_group));
    ASSERT_OK(off_->FinishIteration());
    ExpectClean();
  }
}

// The same for a sparse view the group itself leaves on device
// (skip_sparse_views): the first half of x's rows is copied, every other
// row of its second half (coverage below 0.9) is not, so x's storage stays.
TEST_F(PipelineReliabilityTest, ForcedReleaseSparesAViewLeftOnDevice) {
  PipelineOffloadOptions options = Modules({"mlp"});
  options.skip_sparse_views = true;
  options.min_span_coverage = 0.9;
  Make(options);
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart("mlp"));
  Tensor x = New(1);
  Tensor sparse = x;  // every other row of the second half: left on device
  sparse.shape = {16, 64};
  sparse.strides = {128, 1};
  sparse.offset = 32 * 64;
  Tensor half = x;  // the first half: copied
  half.shape = {32, 64};
  ASSERT_OK_AND_ASSIGN(SavedTensor saved_sparse, off_->Push(sparse));
  ASSERT_OK_AND_ASSIGN(SavedTensor saved_x, off_->Push(half));
  ASSERT_OK(off_->GroupCommit("mlp", {x}));
  ASSERT_NE(x.storage->data(), nullptr);
  EXPECT_THAT(off_->diagnostics().warnings().back(),
              HasSubstr("a view of this group left on device"));
  x = Tensor();
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("mlp"));
  ASSERT_OK_AND_ASSIGN(Tensor back, off_->Pop(saved_x));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> half_bytes, HostBytes(*sim_, back));
  EXPECT_EQ(half_bytes, PatternTensorBytes(half, 1));
  ASSERT_OK_AND_ASSIGN(back, off_->Pop(saved_sparse));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, back));
  EXPECT_EQ(bytes, PatternTensorBytes(sparse, 1));
  back = Tensor();
  ASSERT_OK(off_->GroupBackwardEnd("mlp"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// Defence in depth: a kept handle whose storage's memory is gone (here
// forged) is refused by Pop, naming the tensor, instead of handed back.
TEST_F(PipelineReliabilityTest, PopNeverReturnsATensorWithoutMemory) {
  Make(Modules({"core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart("attn_norm"));  // not offloaded: kept handles
  Tensor x = New(1);
  ASSERT_OK_AND_ASSIGN(SavedTensor saved, off_->Push(x));
  ASSERT_OK(off_->GroupCommit("attn_norm", {}));
  ASSERT_OK(x.storage->memory().ReleaseAfter(sim_->ComputeStream()));
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("attn_norm"));
  EXPECT_THAT(off_->Pop(saved),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("memory was released")));
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

class PipelineAbandonTest : public pipeline_test::SimPipelineTest {
 protected:
  // One iteration of chunks (0,0) and (0,1), one core_attn group each with
  // tensors of seeds 1 and 2, run to the end and checked.
  void FullIteration() {
    ASSERT_OK(off_->StartChunk(0, 0));
    SavedTensor s0 = Group("core_attn", 1);
    ASSERT_OK(off_->StartChunk(0, 1));
    SavedTensor s1 = Group("core_attn", 2);
    for (int mb : {0, 1}) {
      ASSERT_OK(off_->StartChunkBackward(0, mb));
      ASSERT_OK(off_->GroupBackwardStart("core_attn"));
      PopAndCheck(mb == 0 ? s0 : s1, mb + 1);
      ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
    }
    ASSERT_OK(off_->FinishIteration());
  }
};

// SPEC §7.2 for the fine-grained door: an iteration dropped mid-forward (a
// group open, an earlier group offloaded) or mid-backward releases every
// device byte it held, warns naming how far it got, refuses its handles,
// and the next iterations run (after the warm-up, under the same frozen
// plan; in it, the warm-up runs again). Between iterations it is a no-op.
TEST_F(PipelineAbandonTest, ADroppedIterationReleasesItsMemoryAndTheNextRuns) {
  for (bool warmed_up : {false, true}) {
    for (bool in_backward : {false, true}) {
      SCOPED_TRACE(std::string(warmed_up ? "after" : "in") + " the warm-up, " +
                   (in_backward ? "in the backward" : "in the forward"));
      Make(Modules({"core_attn"}));
      if (warmed_up) {
        ASSERT_NO_FATAL_FAILURE(FullIteration());
      }
      ASSERT_TRUE(off_->warmed_up() == warmed_up);
      sim_->RunUntilIdle();
      const int64_t before = sim_->DeviceBytesInUse();
      ASSERT_OK(off_->StartChunk(0, 0));
      SavedTensor s0 = Group("core_attn", 1);
      ASSERT_OK(off_->StartChunk(0, 1));
      ASSERT_OK(off_->GroupStart("core_attn"));
      {
        Tensor t = New(2);
        ASSERT_OK(off_->Push(t).status());
      }
      if (in_backward) {
        ASSERT_OK(off_->GroupCommit("core_attn", {}));
        ASSERT_OK(off_->StartChunkBackward(0, 0));
        ASSERT_OK(off_->GroupBackwardStart("core_attn"));
      }
      ASSERT_OK(off_->AbandonIteration());
      EXPECT_THAT(off_->diagnostics().warnings().back(),
                  HasSubstr("AbandonIteration of iteration"));
      EXPECT_THAT(off_->diagnostics().warnings().back(),
                  HasSubstr(warmed_up ? "dropped after 2 chunks' forward"
                                      : "the warm-up runs again"));
      EXPECT_THAT(off_->Pop(s0).status(),
                  StatusIs(StatusCode::kInvalidArgument));
      // After the warm-up chunk (0, 0)'s group stays on device (§5.4a) and
      // its handle holds the tensor: it goes with the handle.
      s0 = SavedTensor();
      sim_->RunUntilIdle();
      EXPECT_EQ(sim_->DeviceBytesInUse(), before);
      EXPECT_TRUE(off_->warmed_up() == warmed_up);
      ASSERT_OK(off_->AbandonIteration());  // between iterations: no-op
      ASSERT_NO_FATAL_FAILURE(FullIteration());
      ASSERT_NO_FATAL_FAILURE(FullIteration());
      EXPECT_TRUE(off_->warmed_up());
      ExpectClean();
    }
  }
}

}  // namespace
}  // namespace offload
