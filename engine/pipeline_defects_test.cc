// SPEC §5.8: each upstream defect of Megatron's fine-grained offloading is a
// test here that fails on a variant of this engine with that defect
// (docs/testing.md's planted-bug table says which). Plus the behaviours
// upstream's own tests check: the push filter, whole-storage spans, sparse
// views, duplicate-byte accounting.

#include <memory>
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
using ::testing::IsEmpty;
using offload_test::Consume;
using offload_test::HostBytes;
using offload_test::Produce;
using pipeline_test::kElements;
using pipeline_test::Modules;

class PipelineDefectsTest : public pipeline_test::SimPipelineTest {};

// (a) Chunk mismatch: a chunk whose groups all stay on device is still a
// chunk; the groups after StartChunk land in the chunk the caller named.
TEST_F(PipelineDefectsTest, A_GroupsLandInTheChunkTheCallerNamed) {
  Make(Modules({"core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  SavedTensor only_kept = Group("attn_norm", 1);
  std::vector<SavedTensor> kept, offloaded;
  for (int mb = 1; mb <= 2; ++mb) {
    ASSERT_OK(off_->StartChunk(0, mb));
    kept.push_back(Group("attn_norm", 10 * mb));
    offloaded.push_back(Group("core_attn", 10 * mb + 1));
  }
  EXPECT_EQ(off_->state(0, 0, "attn_norm", 0), GroupState::kNotOffloaded);
  EXPECT_EQ(off_->state(0, 0, "core_attn", 0), GroupState::kNotOffloaded);
  for (int mb = 1; mb <= 2; ++mb) {
    EXPECT_EQ(off_->state(0, mb, "core_attn", 0),
              GroupState::kOffloadFinished);
    EXPECT_EQ(off_->state(0, mb, "attn_norm", 1), GroupState::kNotOffloaded);
  }
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("attn_norm"));
  PopAndCheck(only_kept, 1);
  ASSERT_OK(off_->GroupBackwardEnd("attn_norm"));
  for (int mb = 1; mb <= 2; ++mb) {
    ASSERT_OK(off_->StartChunkBackward(0, mb));
    ASSERT_OK(off_->GroupBackwardStart("core_attn"));
    PopAndCheck(offloaded[mb - 1], 10 * mb + 1);
    ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
    ASSERT_OK(off_->GroupBackwardStart("attn_norm"));
    PopAndCheck(kept[mb - 1], 10 * mb);
    ASSERT_OK(off_->GroupBackwardEnd("attn_norm"));
  }
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// (b) A reload nobody started ahead — at the group's backward or at its
// first pop — waits for the group's own copy to host, which is still
// running (10 MB/s D2H).
TEST_F(PipelineDefectsTest, B_InlineReloadWaitsForItsOwnCopyToHost) {
  for (bool through_pop : {false, true}) {
    SCOPED_TRACE(through_pop ? "reload at Pop" : "reload at backward start");
    SimOptions slow;
    slow.d2h_gbps = 0.01;
    Make(Modules({"core_attn"}), slow);
    ASSERT_OK(off_->StartChunk(0, 0));
    SavedTensor saved = Group("core_attn", 7);
    ASSERT_OK(off_->StartChunkBackward(0, 0));
    if (through_pop) {
      PopAndCheck(saved, 7);
      ASSERT_OK(off_->GroupBackwardStart("core_attn"));
    } else {
      ASSERT_OK(off_->GroupBackwardStart("core_attn"));
      EXPECT_EQ(off_->state(0, 0, "core_attn", 0),
                GroupState::kReloadStarted);
      PopAndCheck(saved, 7);
    }
    ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
    ASSERT_OK(off_->FinishIteration());
    ExpectClean();
  }
}

// (c) A pooled pinned buffer is handed out again only after the H2D copy
// reading it completed. The group's tensors are never popped (its reload
// still runs at 10 MB/s), and the next group's tensor comes from a side
// stream, so only the pool's own ordering protects the buffer.
TEST_F(PipelineDefectsTest, C_PooledBufferWaitsForTheReloadReadingIt) {
  SimOptions slow;
  slow.h2d_gbps = 0.01;
  Make(Modules({"core_attn"}), slow);
  Stream* side = *sim_->NewStream("side");
  ASSERT_OK(off_->StartChunk(0, 0));
  Group("core_attn", 1);
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));  // reload, never popped
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  // The next chunk's group reuses the pooled buffer (same bytes, dtype).
  ASSERT_OK(off_->StartChunk(0, 1));
  ASSERT_OK(off_->GroupStart("core_attn"));
  Tensor t;
  t.dtype = DType::kF32;
  t.shape = {64, 64};
  t.strides = {64, 1};
  t.storage = std::make_shared<Storage>(
      *sim_->AllocateDevice(kElements * 4, *side));
  SimKernel fill;
  fill.name = "side producer";
  fill.writes = {{t.storage->data(), kElements * 4}};
  fill.body = [data = t.storage->data()](SimBackend& s) {
    FillPattern(*s.MutableBytes(data, kElements * 4), kElements * 4, 9);
  };
  ASSERT_OK(sim_->EnqueueKernel(*side, fill));
  t.ready = *sim_->NewEvent();
  ASSERT_OK(side->Record(*t.ready));
  ASSERT_OK_AND_ASSIGN(SavedTensor saved, off_->Push(t));
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  EXPECT_EQ(off_->stats().pinned_allocations, 1);  // reused
  t = Tensor();
  ASSERT_OK(off_->StartChunkBackward(0, 1));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(saved, 9);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// (d) Delayed offloads (graph mode) still queued when the backward starts
// are issued then, with a warning — never silently dropped.
TEST_F(PipelineDefectsTest, D_QueuedDelayedOffloadsAreIssuedNotDropped) {
  PipelineOffloadOptions options = Modules({"core_attn", "attn_proj"});
  options.delay_offload = true;
  Make(options);
  ASSERT_OK(off_->StartChunk(0, 0));
  SavedTensor a = Group("core_attn", 1);
  SavedTensor b = Group("attn_proj", 2);
  EXPECT_EQ(off_->stats().bytes_offloaded, 0);  // queued
  EXPECT_EQ(off_->state(0, 0, "core_attn", 0), GroupState::kNotOffloaded);
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  EXPECT_EQ(off_->stats().bytes_offloaded, 2 * kElements * 4);
  EXPECT_THAT(off_->diagnostics().warnings().back(),
              HasSubstr("2 delayed offloads were still queued"));
  ASSERT_OK(off_->GroupBackwardStart("attn_proj"));
  PopAndCheck(b, 2);
  ASSERT_OK(off_->GroupBackwardEnd("attn_proj"));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(a, 1);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
  // Issued explicitly: no warning.
  const size_t warnings = off_->diagnostics().warnings().size();
  ASSERT_OK(off_->StartChunk(0, 0));
  a = Group("core_attn", 3);
  b = Group("attn_proj", 4);
  ASSERT_OK(off_->IssueDelayedOffloads());
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  EXPECT_EQ(off_->diagnostics().warnings().size(), warnings);
}

// (e) Under partial offload the reload runs one offloaded group ahead, not
// several: groups of name "a" are offloaded, "b" stay; after each group's
// backward at most one group whose backward has not begun is reloading.
TEST_F(PipelineDefectsTest, E_ReloadRunsOneGroupAheadUnderPartialOffload) {
  Make(Modules({"a"}));
  const std::vector<std::string> names = {"a", "b", "a", "b", "a", "b", "a"};
  for (int iteration = 0; iteration < 2; ++iteration) {
    for (int chunk = 0; chunk < 2; ++chunk) {
      ASSERT_OK(off_->StartChunk(0, chunk));
      for (size_t i = 0; i < names.size(); ++i) Group(names[i], 10 + i);
    }
    for (int chunk = 0; chunk < 2; ++chunk) {
      ASSERT_OK(off_->StartChunkBackward(0, chunk));
      for (int i = static_cast<int>(names.size()) - 1; i >= 0; --i) {
        ASSERT_OK(off_->GroupBackwardStart(names[i]));
        ASSERT_OK(off_->GroupBackwardEnd(names[i]));
        int ahead = 0;
        for (int c = 0; c < 2; ++c) {
          for (int o = 0; o < 4; ++o) {
            const bool begun = c < chunk || (c == chunk && 2 * o >= i);
            if (!begun && off_->state(0, c, "a", o) ==
                              GroupState::kReloadStarted) {
              ++ahead;
            }
          }
        }
        EXPECT_LE(ahead, 1) << "iteration " << iteration << " chunk "
                            << chunk << " after group " << i;
      }
    }
    ASSERT_OK(off_->FinishIteration());
  }
  ExpectClean();
}

// (f) A group's backward belongs to that group: with two groups named
// core_attn in a chunk, GroupBackwardStart reloads the later one (reverse
// commit order), and each pop waits for its own group's reload.
TEST_F(PipelineDefectsTest, F_BackwardUsesItsOwnGroupNotASameNamedOne) {
  SimOptions slow;
  slow.h2d_gbps = 0.01;
  Make(Modules({"core_attn"}), slow);
  ASSERT_OK(off_->StartChunk(0, 0));
  SavedTensor first = Group("core_attn", 1);
  SavedTensor second = Group("core_attn", 2);
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  EXPECT_EQ(off_->state(0, 0, "core_attn", 1), GroupState::kReloadStarted);
  EXPECT_EQ(off_->state(0, 0, "core_attn", 0), GroupState::kOffloadFinished);
  PopAndCheck(second, 2);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  EXPECT_EQ(off_->state(0, 0, "core_attn", 0), GroupState::kReloadStarted);
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(first, 1);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// (h) release_tensors frees only a storage this group copied: one the group
// did not copy (the caller still uses it) and one that an enclosing group
// has yet to copy both stay.
TEST_F(PipelineDefectsTest, H_ForcedReleaseOnlyOfStoragesThisGroupCopied) {
  Make(Modules({"attn_norm", "core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart("attn_norm"));
  Tensor x = New(1);
  ASSERT_OK_AND_ASSIGN(SavedTensor saved_x, off_->Push(x));
  Tensor other = New(2);  // never pushed
  ASSERT_OK(off_->GroupStart("core_attn"));
  ASSERT_OK_AND_ASSIGN(SavedTensor inner_x, off_->Push(x));
  ASSERT_OK(off_->GroupCommit("core_attn", {x, other}));
  EXPECT_NE(x.storage->data(), nullptr);      // attn_norm still copies it
  EXPECT_NE(other.storage->data(), nullptr);  // not copied by core_attn
  const auto& warnings = off_->diagnostics().warnings();
  EXPECT_THAT(warnings[warnings.size() - 2], HasSubstr("open group"));
  EXPECT_THAT(warnings.back(), HasSubstr("was not copied by this group"));
  ASSERT_OK(Consume(*sim_, {other}, 1000, "caller uses other"));
  ASSERT_OK(off_->GroupCommit("attn_norm", {x}));
  EXPECT_EQ(x.storage->data(), nullptr);  // copied by attn_norm: released
  x = Tensor();
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("attn_norm"));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  PopAndCheck(inner_x, 1);
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  PopAndCheck(saved_x, 1);
  ASSERT_OK(off_->GroupBackwardEnd("attn_norm"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// Upstream's checks of the push filter: parameters, CPU (pinned) tensors,
// marked tensors and small tensors come back untouched.
TEST_F(PipelineDefectsTest, FilterSkipsParametersCpuMarkedAndSmallTensors) {
  Make(Modules({"core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart("core_attn"));
  Tensor param = New(1);
  param.flags.parameter = true;
  Tensor marked = New(2);
  MarkNotOffload(marked);
  Tensor small = *Produce(*sim_, DType::kF32, {16}, 3);
  Tensor cpu = New(4);
  cpu.storage = std::make_shared<Storage>(*sim_->AllocatePinned(kElements * 4));
  std::vector<SavedTensor> saved;
  for (const Tensor& t : {param, marked, small, cpu}) {
    ASSERT_OK_AND_ASSIGN(SavedTensor s, off_->Push(t));
    EXPECT_FALSE(s.in_group());
    saved.push_back(s);
  }
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  EXPECT_EQ(off_->stats().tensors_offloaded, 0);
  EXPECT_EQ(off_->stats().bytes_offloaded, 0);
  ASSERT_OK_AND_ASSIGN(Tensor back, off_->Pop(saved[0]));
  EXPECT_EQ(back.storage, param.storage);
}

// Upstream: a view covering at least half of the bytes it spans is copied
// as that whole span and rebuilt as a view; a sparser one is gathered (made
// contiguous on the compute stream).
TEST_F(PipelineDefectsTest, DenseViewsCopyTheSpanSparseOnesAreGathered) {
  Make(Modules({"core_attn"}));
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart("core_attn"));
  Tensor base = New(5);
  Tensor half = base;  // every other row: 2048 of 4032 elements spanned
  half.shape = {32, 64};
  half.strides = {128, 1};
  Tensor sparse_base = New(6);
  Tensor sparse = sparse_base;  // every 4th row: 1024 of 3904 spanned
  sparse.shape = {16, 64};
  sparse.strides = {256, 1};
  ASSERT_OK_AND_ASSIGN(SavedTensor saved_half, off_->Push(half));
  ASSERT_OK_AND_ASSIGN(SavedTensor saved_sparse, off_->Push(sparse));
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  EXPECT_EQ(off_->stats().bytes_offloaded,
            (31 * 128 + 64) * 4 + sparse.nbytes());  // span + gathered view
  EXPECT_EQ(off_->stats().views_made_contiguous, 1);
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart("core_attn"));
  ASSERT_OK_AND_ASSIGN(Tensor back, off_->Pop(saved_half));
  EXPECT_EQ(back.shape, half.shape);
  EXPECT_EQ(back.strides, half.strides);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, back));
  EXPECT_EQ(bytes, PatternTensorBytes(half, 5));
  ASSERT_OK_AND_ASSIGN(Tensor back_sparse, off_->Pop(saved_sparse));
  ASSERT_OK_AND_ASSIGN(bytes, HostBytes(*sim_, back_sparse));
  EXPECT_EQ(bytes, PatternTensorBytes(sparse, 6));
  ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
  ASSERT_OK(off_->FinishIteration());
  ExpectClean();
}

// Upstream: duplicate-byte accounting. A storage the caller keeps through
// the group's whole life was copied for nothing: counted in the summary and
// warned about once, at the freeze.
TEST_F(PipelineDefectsTest, CallerHeldCopiesAreCountedInTheSummary) {
  Make(Modules({"core_attn"}));
  for (int chunk = 0; chunk < 2; ++chunk) {
    ASSERT_OK(off_->StartChunk(0, chunk));
  }
  // (chunks start empty; groups go to the current chunk, (0, 1))
  Tensor held = New(1);
  ASSERT_OK(off_->GroupStart("core_attn"));
  ASSERT_OK(off_->Push(held).status());
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  ASSERT_OK(off_->GroupStart("core_attn"));
  ASSERT_OK(off_->Push(New(2)).status());
  ASSERT_OK(off_->GroupCommit("core_attn", {}));
  for (int chunk = 0; chunk < 2; ++chunk) {
    ASSERT_OK(off_->StartChunkBackward(0, chunk));
    if (chunk == 1) {
      for (int g = 0; g < 2; ++g) {
        ASSERT_OK(off_->GroupBackwardStart("core_attn"));
        ASSERT_OK(off_->GroupBackwardEnd("core_attn"));
      }
    }
  }
  ASSERT_OK(off_->FinishIteration());
  ASSERT_TRUE(off_->summary().has_value());
  EXPECT_EQ(off_->summary()->caller_held_bytes, kElements * 4);
  EXPECT_THAT(off_->diagnostics().warnings().back(),
              HasSubstr("duplicate copies"));
  held = Tensor();
  ExpectClean();
}

}  // namespace
}  // namespace offload
