// SPEC §5.7, the fine-grained mode with graph launches (Megatron's per-layer
// CUDA graphs with --delay-offload-until-cuda-graph): a region's forward
// kernels are captured once into a graph that writes static device buffers
// and replayed by Launch; the offloader's host calls for the region run
// around each launch, with delay_offload the commits are queued and
// IssueDelayedOffloads, right after the launch, issues the copies outside
// the graph, ordered after it. Not covered here: queued commits never
// issued are issued at the next backward start (or iteration end) with a
// warning naming them — pipeline_defects_test's
// D_QueuedDelayedOffloadsAreIssuedNotDropped.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/offload_test_util.h"
#include "testing/byte_pattern.h"
#include "testing/pipeline_test_util.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using pipeline_test::kElements;
using pipeline_test::Modules;

constexpr int64_t kBytes = kElements * 4;
constexpr int kMicrobatches = 2;
const char* const kNames[] = {"core_attn", "attn_proj"};
constexpr int kGroups = 2;

uint64_t Seed(uint64_t epoch, int mb, int group) {
  return epoch * 1000 + static_cast<uint64_t>(mb) * 10 + group + 1;
}

int CountD2HCopies(const SimBackend& sim, size_t from) {
  int n = 0;
  for (size_t i = from; i < sim.trace().size(); ++i) {
    const SimTraceEntry& e = sim.trace()[i];
    n += e.phase == SimPhase::kEnqueue && e.kind == SimOpKind::kCopy &&
         e.stream_name != sim.trace()[0].stream_name && e.bytes == kBytes;
  }
  return n;
}

class PipelineGraphTest : public pipeline_test::SimPipelineTest {
 protected:
  PipelineOffloadOptions Options(bool delay) {
    PipelineOffloadOptions options = Modules({kNames[0], kNames[1]});
    options.min_offload_elements = 1024;
    options.delay_offload = delay;
    return options;
  }

  // The static device buffers of microbatch `mb`'s region (one tensor per
  // group), allocated before any capture.
  void MakeStatic() {
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      for (int g = 0; g < kGroups; ++g) {
        ASSERT_OK_AND_ASSIGN(Buffer buffer,
                             sim_->AllocateDevice(kBytes, sim_->ComputeStream()));
        Tensor t;
        t.storage = std::make_shared<Storage>(std::move(buffer));
        t.dtype = DType::kF32;
        t.shape = {kElements};
        t.strides = {1};
        t.name = "mb" + std::to_string(mb) + "." + kNames[g];
        static_[mb][g] = std::move(t);
      }
    }
  }

  // The region's compute: one kernel writing both static buffers with the
  // pattern of the epoch the host set (read when the kernel runs).
  Status EnqueueRegion(int mb) {
    SimKernel kernel;
    kernel.name = "forward mb" + std::to_string(mb);
    kernel.duration_ns = 20000;
    std::vector<void*> targets;
    for (int g = 0; g < kGroups; ++g) {
      kernel.writes.push_back(SimRange{static_[mb][g].storage->data(), kBytes});
      targets.push_back(static_[mb][g].storage->data());
    }
    std::shared_ptr<uint64_t> epoch = epoch_;
    kernel.body = [epoch, targets, mb](SimBackend& sim) {
      for (int g = 0; g < kGroups; ++g) {
        StatusOr<uint8_t*> bytes = sim.MutableBytes(targets[g], kBytes);
        if (bytes.ok()) FillPattern(*bytes, kBytes, Seed(*epoch, mb, g));
      }
    };
    return sim_->EnqueueKernel(sim_->ComputeStream(), std::move(kernel));
  }

  // The offloader's host calls for microbatch `mb`'s region.
  void HostCalls(int mb) {
    ASSERT_OK(off_->StartChunk(0, mb));
    for (int g = 0; g < kGroups; ++g) {
      ASSERT_OK(off_->GroupStart(kNames[g]));
      ASSERT_OK_AND_ASSIGN(saved_[mb][g], off_->Push(static_[mb][g]));
      ASSERT_OK(off_->GroupCommit(kNames[g]));
    }
  }

  void Backward(uint64_t epoch) {
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      ASSERT_OK(off_->StartChunkBackward(0, mb));
      for (int g = kGroups - 1; g >= 0; --g) {
        ASSERT_OK(off_->GroupBackwardStart(kNames[g]));
        ASSERT_OK_AND_ASSIGN(Tensor t, off_->Pop(saved_[mb][g]));
        ASSERT_OK(offload_test::Consume(*sim_, {t}, 1000));
        ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                             offload_test::HostBytes(*sim_, t));
        EXPECT_EQ(bytes, PatternBytes(0, kBytes, Seed(epoch, mb, g)))
            << "epoch " << epoch << " mb" << mb << " " << kNames[g];
        ASSERT_OK(off_->GroupBackwardEnd(kNames[g]));
      }
    }
    ASSERT_OK(off_->FinishIteration());
  }

  std::shared_ptr<uint64_t> epoch_ = std::make_shared<uint64_t>(0);
  Tensor static_[kMicrobatches][kGroups];
  SavedTensor saved_[kMicrobatches][kGroups];
};

// Capture once (the offloader's calls during the capture queue the commits;
// issuing then is refused and keeps the queue), then per iteration: host
// calls, Launch, IssueDelayedOffloads. Every popped byte is what that
// iteration's launch wrote; the copies run after the launch, outside the
// graph; no hazards.
TEST_F(PipelineGraphTest, DelayedOffloadsIssuedAfterEachLaunch) {
  Make(Options(/*delay=*/true));
  MakeStatic();
  Stream& compute = sim_->ComputeStream();
  std::unique_ptr<GraphExec> exec[kMicrobatches];
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    *epoch_ = epoch;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      if (epoch == 1) {  // the warm-up iteration captures the region
        ASSERT_OK(sim_->BeginCapture(compute, CaptureMode::kGlobal));
        ASSERT_OK(EnqueueRegion(mb));
        HostCalls(mb);
        const int64_t offloaded = off_->stats().bytes_offloaded;
        EXPECT_THAT(
            off_->IssueDelayedOffloads(),
            StatusIs(StatusCode::kFailedPrecondition,
                     AllOf(HasSubstr("capturing"),
                           HasSubstr("after the region's Launch"),
                           HasSubstr("2 still queued"),
                           HasSubstr("group 'core_attn' #0 of"))));
        EXPECT_EQ(off_->stats().bytes_offloaded, offloaded);
        EXPECT_EQ(off_->state(0, mb, kNames[0], 0), GroupState::kNotOffloaded);
        ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                             sim_->EndCapture(compute));
        ASSERT_OK_AND_ASSIGN(exec[mb], sim_->Instantiate(*graph));
      } else {
        HostCalls(mb);
      }
      // Queued: nothing of this region is offloaded before its launch.
      EXPECT_EQ(off_->state(0, mb, kNames[0], 0), GroupState::kNotOffloaded);
      const size_t launch = sim_->trace().size();
      ASSERT_OK(sim_->Launch(*exec[mb], compute));
      ASSERT_OK(off_->IssueDelayedOffloads());
      // The copies of the groups this iteration offloads (warm-up: all;
      // later, the front chunk's last group of each name stays, §5.4a)
      // were enqueued after the launch, eagerly.
      int expected = 0;
      for (int g = 0; g < kGroups; ++g) {
        const GroupState state = off_->state(0, mb, kNames[g], 0);
        expected += state != GroupState::kNotOffloaded;
      }
      EXPECT_EQ(expected, epoch == 1 || mb == 1 ? kGroups : 0) << "mb" << mb;
      EXPECT_EQ(CountD2HCopies(*sim_, launch), expected) << "mb" << mb;
    }
    Backward(epoch);
    sim_->RunUntilIdle();
    EXPECT_THAT(sim_->hazards(), IsEmpty());
    if (HasFailure()) return;
  }
  EXPECT_GT(off_->stats().bytes_offloaded, 0);
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    for (int g = 0; g < kGroups; ++g) saved_[mb][g] = SavedTensor();
  }
  ExpectClean();
}

// Without delay_offload the offload is not capture-safe: a push into an
// offloaded group and its commit are refused while the compute stream
// captures, naming the group; nothing changed, and after the capture the
// commit goes through.
TEST_F(PipelineGraphTest, UndelayedOffloadRefusedWhileCapturing) {
  Make(Options(/*delay=*/false));
  MakeStatic();
  *epoch_ = 5;
  Stream& compute = sim_->ComputeStream();
  ASSERT_OK(EnqueueRegion(0));
  ASSERT_OK(off_->StartChunk(0, 0));
  ASSERT_OK(off_->GroupStart(kNames[0]));
  ASSERT_OK_AND_ASSIGN(saved_[0][0], off_->Push(static_[0][0]));
  ASSERT_OK(sim_->BeginCapture(compute, CaptureMode::kGlobal));
  EXPECT_THAT(off_->Push(static_[0][1]),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("group 'core_attn' #0"),
                             HasSubstr("delay_offload"))));
  EXPECT_THAT(off_->GroupCommit(kNames[0]),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("group 'core_attn' #0"),
                             HasSubstr("capturing"),
                             HasSubstr("delay_offload"))));
  EXPECT_EQ(off_->state(0, 0, kNames[0], 0), GroupState::kNotOffloaded);
  EXPECT_EQ(off_->stats().pinned_allocations, 0);
  // IssueDelayedOffloads is refused during a capture whatever the mode.
  EXPECT_THAT(off_->IssueDelayedOffloads(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("after the region's Launch")));
  // So is dropping the iteration (SPEC §7.2): its frees would be captured.
  EXPECT_THAT(off_->AbandonIteration(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("not during a graph capture")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       sim_->EndCapture(compute));
  ASSERT_OK(off_->GroupCommit(kNames[0]));  // the group was still open
  EXPECT_NE(off_->state(0, 0, kNames[0], 0), GroupState::kNotOffloaded);
  ASSERT_OK(off_->StartChunkBackward(0, 0));
  ASSERT_OK(off_->GroupBackwardStart(kNames[0]));
  ASSERT_OK_AND_ASSIGN(Tensor t, off_->Pop(saved_[0][0]));
  ASSERT_OK(offload_test::Consume(*sim_, {t}, 1000));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                       offload_test::HostBytes(*sim_, t));
  EXPECT_EQ(bytes, PatternBytes(0, kBytes, Seed(5, 0, 0)));
  ASSERT_OK(off_->GroupBackwardEnd(kNames[0]));
  ASSERT_OK(off_->FinishIteration());
  saved_[0][0] = SavedTensor();
  ExpectClean();
}

}  // namespace
}  // namespace offload
