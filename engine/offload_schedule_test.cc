// Scheduling and timing of the layer-mode Offloader (SPEC §3.4, §4, §6.1,
// §6.6) on the simulated GPU: manual synchronization, default and table
// schedules, per-span waits, ready points, overlap of copies with compute,
// determinism. Round trips and memory: offload_test.cc; errors and faults:
// offload_errors_test.cc.
//
// Every test ends by checking that the simulator's hazard detector found
// nothing (SimOffloadTest::TearDown), after the test's tensors and its
// Offloader were destroyed.

#include "engine/offload.h"

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "testing/offload_test_util.h"
#include "engine/schedule.h"
#include "engine/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/status_matchers.h"
#include "workload/layer_loop.h"
#include "workload/tensor_util.h"

namespace offload {
namespace offload_test {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ------------------------------------------------------------ manual mode

// TE's manual-synchronization example: run the forward of every layer, then
// start the offload of every layer, release them all, start their reloads in
// reverse order, then run the backward. The last layer is offloaded too:
// StartOffload closes its (still open) forward. Every byte comes back.
TEST_F(OffloaderTest, ManualSynchronizationExampleRoundTrips) {
  constexpr int kLayers = 3;
  OffloadOptions options;
  options.model_layers = kLayers;
  options.manual_synchronization = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_TRUE(offloader->WillOffload(layer));
  }
  EXPECT_THAT(offloader->schedule(), IsEmpty());
  std::vector<std::vector<Pushed>> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardUniform(*offloader, kLayers, 2, saved));
  // Nothing happens on its own in manual mode.
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(offloader->state(layer), GroupState::kNotOffloaded);
  }
  EXPECT_EQ(offloader->stats().spans_offloaded, 0);

  for (int layer = 0; layer < kLayers; ++layer) {
    ASSERT_OK(offloader->StartOffload(layer));
    EXPECT_EQ(offloader->state(layer), GroupState::kOffloadStarted);
  }
  for (int layer = 0; layer < kLayers; ++layer) {
    ASSERT_OK(offloader->ReleaseForwardMemory(layer));
    EXPECT_EQ(offloader->state(layer), GroupState::kOffloadFinished);
  }
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);  // all on host now
  EXPECT_EQ(offloader->OffloadedBytes(), kLayers * 2 * kMiB);
  for (int layer = kLayers - 1; layer >= 0; --layer) {
    ASSERT_OK(offloader->StartReload(layer));
    EXPECT_EQ(offloader->state(layer), GroupState::kReloadStarted);
  }
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
}

// Manual mode interleaved with the forward (pipeline style): each layer's
// offload starts right after the next layer's ForwardStep; with a custom
// offload_stream every copy runs on it and the Offloader uses no other
// stream.
TEST_F(OffloaderTest, ManualModeRunsAllCopiesOnTheGivenOffloadStream) {
  constexpr int kLayers = 3;
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  OffloadOptions options;
  options.model_layers = kLayers;
  options.manual_synchronization = true;
  options.offload_stream = side;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  std::vector<std::vector<Pushed>> saved(kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    // Braces: the assertion macros end in an `else` of their own.
    if (layer > 0) {
      ASSERT_OK(offloader->StartOffload(layer - 1));
    }
    if (layer > 1) {
      ASSERT_OK(offloader->ReleaseForwardMemory(layer - 2));
    }
    ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(*sim_, DType::kBF16,
                                                    {512, 1024}, 60 + layer));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, t, 60 + layer,
                                            saved[layer]));
  }
  // Layer 2 stays on device; layer 1 is released now; reloads in reverse.
  ASSERT_OK(offloader->ReleaseForwardMemory(1));
  ASSERT_OK(offloader->StartReload(1));
  ASSERT_OK(offloader->StartReload(0));
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
  sim_->RunUntilIdle();
  std::set<std::string> streams;
  int side_d2h = 0, side_h2d = 0;
  for (const SimTraceEntry& entry : sim_->trace()) {
    streams.insert(entry.stream_name);
    if (entry.stream_name != "side" || entry.phase != SimPhase::kStart) {
      continue;
    }
    if (MovesInto(MemorySpace::kPinnedHost)(entry)) ++side_d2h;
    if (MovesInto(MemorySpace::kDevice)(entry)) ++side_h2d;
  }
  EXPECT_EQ(streams, (std::set<std::string>{"compute", "side", "host"}));
  EXPECT_EQ(side_d2h, 2);
  EXPECT_EQ(side_h2d, 2);
}

// Manual mode: a layer whose offload started but whose memory was never
// released still has its tensors on device; Pop gives them back, and the
// group's end waits for the copies still reading them.
TEST_F(OffloaderTest, ManualOffloadStartedButNotReleasedPopsFromDevice) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(2)));
  std::vector<std::vector<Pushed>> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardUniform(*offloader, 2, 2, saved));
  ASSERT_OK(offloader->StartOffload(0));
  ASSERT_OK(offloader->StartOffload(1));
  EXPECT_EQ(offloader->state(0), GroupState::kOffloadStarted);
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->stats().bytes_reloaded, 0);
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

// ------------------------------------------------------------ scheduling

// The default schedule for n = 5, k = 2 drives the group states (SPEC §4.1):
// layer 0 is released when layer 3 begins its forward, layer 1 when layer 4
// does; layer 1 reloads when layer 3's backward begins, layer 0 when layer
// 2's does; a group is released when the next backward step begins.
TEST_F(OffloaderTest, DefaultScheduleReleasesAndReloadsAtTheSpecifiedSteps) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(5, 2)));
  ASSERT_OK_AND_ASSIGN(ScheduleTable expected, DefaultSchedule(5, 2));
  EXPECT_EQ(offloader->schedule(), expected);
  EXPECT_TRUE(offloader->WillOffload(0));
  EXPECT_TRUE(offloader->WillOffload(1));
  EXPECT_FALSE(offloader->WillOffload(2));
  EXPECT_THAT(offloader->diagnostics().warnings(), IsEmpty());

  std::vector<std::vector<Pushed>> saved(5);
  auto forward = [&](int layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(*sim_, DType::kF32,
                                                    {256 * 1024}, 70 + layer));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, t, 70 + layer,
                                            saved[layer]));
  };
  using S = GroupState;
  ASSERT_NO_FATAL_FAILURE(forward(0));
  EXPECT_EQ(offloader->state(0), S::kNotOffloaded);
  ASSERT_NO_FATAL_FAILURE(forward(1));
  EXPECT_EQ(offloader->state(0), S::kOffloadStarted);
  ASSERT_NO_FATAL_FAILURE(forward(2));
  EXPECT_EQ(offloader->state(0), S::kOffloadStarted);
  EXPECT_EQ(offloader->state(1), S::kOffloadStarted);
  ASSERT_NO_FATAL_FAILURE(forward(3));
  EXPECT_EQ(offloader->state(0), S::kOffloadFinished);
  EXPECT_EQ(offloader->state(1), S::kOffloadStarted);
  EXPECT_EQ(offloader->state(2), S::kNotOffloaded);
  ASSERT_NO_FATAL_FAILURE(forward(4));
  EXPECT_EQ(offloader->state(1), S::kOffloadFinished);

  ASSERT_OK(offloader->BackwardStep(4));
  EXPECT_EQ(offloader->state(0), S::kOffloadFinished);
  EXPECT_EQ(offloader->state(1), S::kOffloadFinished);
  ASSERT_NO_FATAL_FAILURE(PopAndCheck(*offloader, saved[4]));
  ASSERT_OK(offloader->BackwardStep(3));
  EXPECT_EQ(offloader->state(0), S::kOffloadFinished);
  EXPECT_EQ(offloader->state(1), S::kReloadStarted);
  ASSERT_NO_FATAL_FAILURE(PopAndCheck(*offloader, saved[3]));
  ASSERT_OK(offloader->BackwardStep(2));
  EXPECT_EQ(offloader->state(0), S::kReloadStarted);
  ASSERT_NO_FATAL_FAILURE(PopAndCheck(*offloader, saved[2]));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_NO_FATAL_FAILURE(PopAndCheck(*offloader, saved[1]));
  EXPECT_EQ(offloader->state(1), S::kReloadStarted);
  ASSERT_OK(offloader->BackwardStep(0));
  EXPECT_EQ(offloader->state(1), S::kReleased);
  ASSERT_NO_FATAL_FAILURE(PopAndCheck(*offloader, saved[0]));
  ASSERT_OK(offloader->FinishBackward());
  EXPECT_EQ(offloader->stats().bytes_reloaded, 2 * kMiB);
}

// A schedule table (the design doc's synchronization_dict) may reload during
// the forward: layer 0 released when layer 1 begins, reloaded when layer 3
// begins its forward, before any backward.
TEST_F(OffloaderTest, ScheduleTableCanReloadDuringTheForward) {
  OffloadOptions options = DefaultOptions(4, 0);
  options.schedule = ScheduleTable{{0, ScheduleEntry{true, 2, true, 4}}};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  EXPECT_EQ(offloader->schedule(), *options.schedule);
  EXPECT_TRUE(offloader->WillOffload(0));
  EXPECT_FALSE(offloader->WillOffload(1));
  std::vector<std::vector<Pushed>> saved(4);
  for (int layer = 0; layer < 4; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    if (layer == 1) {
      EXPECT_EQ(offloader->state(0), GroupState::kOffloadFinished);
    }
    if (layer == 2) {
      EXPECT_EQ(offloader->stats().bytes_reloaded, 0);
    }
    ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(*sim_, DType::kF32,
                                                    {256 * 1024}, 80 + layer));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, t, 80 + layer,
                                            saved[layer]));
  }
  EXPECT_EQ(offloader->state(0), GroupState::kReloadStarted);
  EXPECT_EQ(offloader->stats().bytes_reloaded, kMiB);
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

// ---------------------------------------------------- ordering and overlap

// SPEC §3.4: a popped tensor makes the compute stream wait for its own span
// only. Layer 0 saves two large tensors; its reload starts at layer 1's
// backward. At layer 0's backward, the kernel reading the span reloaded
// first starts as soon as that span is back, before the other span's reload
// ended; the kernel reading the other one waits for it.
TEST_F(OffloaderTest, PoppedTensorWaitsOnlyForItsOwnSpan) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  constexpr int64_t kSmall = 4 * kMiB, kLarge = 8 * kMiB;
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  SavedTensor small_handle, large_handle;
  {
    ASSERT_OK_AND_ASSIGN(Tensor small,
                         Produce(*sim_, DType::kF32, {kSmall / 4}, 1, 1000));
    ASSERT_OK_AND_ASSIGN(Tensor large,
                         Produce(*sim_, DType::kF32, {kLarge / 4}, 2, 1000));
    ASSERT_OK_AND_ASSIGN(small_handle, offloader->Push(small));
    ASSERT_OK_AND_ASSIGN(large_handle, offloader->Push(large));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_EQ(offloader->state(0), GroupState::kReloadStarted);

  // Which span's reload was enqueued first (the order is the engine's).
  // A reload: a copy out of pinned memory off the compute stream.
  auto is_reload = [](const SimTraceEntry& entry) {
    return entry.stream_name != "compute" && entry.kind == SimOpKind::kCopy &&
           entry.src.space == MemorySpace::kPinnedHost;
  };
  int64_t small_seq = -1, large_seq = -1;
  for (const SimTraceEntry& entry : sim_->trace()) {
    if (entry.phase != SimPhase::kEnqueue || !is_reload(entry)) continue;
    if (entry.bytes == kSmall) small_seq = static_cast<int64_t>(entry.seq);
    if (entry.bytes == kLarge) large_seq = static_cast<int64_t>(entry.seq);
  }
  ASSERT_GE(small_seq, 0);
  ASSERT_GE(large_seq, 0);
  const bool small_first = small_seq < large_seq;
  const SavedTensor& first = small_first ? small_handle : large_handle;
  const SavedTensor& second = small_first ? large_handle : small_handle;
  const int64_t first_size = small_first ? kSmall : kLarge;
  const int64_t second_size = small_first ? kLarge : kSmall;

  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(Tensor a, offloader->Pop(first));
  ASSERT_OK(Consume(*sim_, {a}, 1000, "use first"));
  ASSERT_OK_AND_ASSIGN(Tensor b, offloader->Pop(second));
  ASSERT_OK(Consume(*sim_, {b}, 1000, "use second"));
  sim_->RunUntilIdle();

  auto reload_end = [&](int64_t size) {
    return TraceTime(*sim_, SimPhase::kEnd, [&](const SimTraceEntry& entry) {
      return is_reload(entry) && entry.bytes == size;
    });
  };
  const int64_t first_back = reload_end(first_size);
  const int64_t second_back = reload_end(second_size);
  const int64_t use_first =
      TraceTime(*sim_, SimPhase::kStart, KernelNamed("use first"));
  const int64_t use_second =
      TraceTime(*sim_, SimPhase::kStart, KernelNamed("use second"));
  ASSERT_GE(first_back, 0);
  ASSERT_GE(second_back, 0);
  EXPECT_GE(use_first, first_back);
  EXPECT_LT(use_first, second_back) << "the first kernel waited for a span "
                                       "it does not read";
  EXPECT_GE(use_second, second_back);
  ASSERT_OK(offloader->FinishBackward());
}

// A kernel of `duration_ns` on `stream` writing bytes [begin, begin + bytes)
// of `storage` so that storage byte i becomes PatternByte(i, seed).
Status WritePattern(SimBackend& sim, Stream& stream, const Storage& storage,
                    int64_t begin, int64_t bytes, uint64_t seed,
                    int64_t duration_ns, std::string name) {
  SimKernel kernel;
  kernel.name = std::move(name);
  kernel.duration_ns = duration_ns;
  const char* data = static_cast<const char*>(storage.data()) + begin;
  kernel.writes = {{data, bytes}};
  kernel.body = [data, begin, bytes, seed](SimBackend& backend) {
    StatusOr<uint8_t*> out = backend.MutableBytes(data, bytes);
    if (out.ok()) FillPattern(*out, bytes, seed, begin);
  };
  return sim.EnqueueKernel(stream, std::move(kernel));
}

// SPEC §2.3: a span's copy waits for the ready points of all the tensors in
// it. Two row halves of one storage are written by two kernels, each pushed
// right after its kernel; the span covering both must not be copied before
// the second kernel finished (the hazard detector and the bytes check it).
TEST_F(OffloaderTest, SpanCopyWaitsForTheReadyPointsOfAllItsTensors) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  {
    Tensor x;
    x.dtype = DType::kF32;
    x.shape = {512, 1024};
    x.strides = ContiguousStrides(x.shape);
    x.name = "x";
    ASSERT_OK_AND_ASSIGN(Buffer buffer,
                         sim_->AllocateDevice(x.nbytes(), sim_->ComputeStream()));
    x.storage = std::make_shared<Storage>(std::move(buffer));
    const int64_t half = x.nbytes() / 2;
    ASSERT_OK_AND_ASSIGN(Tensor top, Slice(x, 0, 0, 256));
    ASSERT_OK_AND_ASSIGN(Tensor bottom, Slice(x, 0, 256, 512));
    ASSERT_OK(WritePattern(*sim_, sim_->ComputeStream(), *x.storage, 0, half,
                           91, 1000, "top"));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, top, 91, saved[0]));
    ASSERT_OK(WritePattern(*sim_, sim_->ComputeStream(), *x.storage, half,
                           half, 91, 50'000, "bottom"));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, bottom, 91, saved[0]));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  EXPECT_EQ(offloader->stats().spans_offloaded, 1);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  EXPECT_GE(TraceTime(*sim_, SimPhase::kStart,
                      MovesInto(MemorySpace::kPinnedHost, "compute")),
            TraceTime(*sim_, SimPhase::kEnd, KernelNamed("bottom")));
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

// SPEC §1.3 (TE's start_offload): a tensor with a ready event recorded on the
// stream that produced it is copied once that event completed, without
// waiting for compute work enqueued after the push.
TEST_F(OffloaderTest, ReadyEventLetsTheCopyStartBeforeLaterCompute) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_OK_AND_ASSIGN(Stream * producer, sim_->NewStream("producer"));
  constexpr int64_t kLongCompute = 10'000'000;
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  {
    Tensor t;
    t.dtype = DType::kF32;
    t.shape = {256 * 1024};
    t.strides = {1};
    t.name = "side_output";
    ASSERT_OK_AND_ASSIGN(Buffer buffer,
                         sim_->AllocateDevice(t.nbytes(), *producer));
    t.storage = std::make_shared<Storage>(std::move(buffer));
    ASSERT_OK(WritePattern(*sim_, *producer, *t.storage, 0, t.nbytes(), 93,
                           1000, "produce on side stream"));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> ready, sim_->NewEvent());
    ASSERT_OK(producer->Record(*ready));
    t.ready = std::move(ready);
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, t, 93, saved[0]));
  }
  // The rest of layer 0's forward: long, and unrelated to the tensor.
  ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(),
                                SimKernel{"long", kLongCompute, {}, {}, nullptr}));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  const int64_t copy_start = TraceTime(
      *sim_, SimPhase::kStart, MovesInto(MemorySpace::kPinnedHost, "compute"));
  EXPECT_GE(copy_start, 1000);
  EXPECT_LT(copy_start, kLongCompute);
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

struct StepResult {
  int64_t step_ns = 0;
  int64_t peak_bytes = 0;
  int64_t bytes_offloaded = 0;
  int64_t bytes_reloaded = 0;
};

// One training step of `layers` layers on a fresh simulator: each layer's
// forward is a kernel of `forward_ns` producing two 1 MiB activations, each
// backward a kernel of `backward_ns` reading them. Returns the virtual time
// the step took and the device high-water mark.
StepResult TimedStep(const SimOptions& sim_options, int layers, int offloaded,
                     int64_t forward_ns, int64_t backward_ns) {
  StepResult result;
  std::unique_ptr<SimBackend> sim = NewSimBackend(sim_options);
  StatusOr<std::unique_ptr<Offloader>> created =
      Offloader::Create(*sim, DefaultOptions(layers, offloaded));
  EXPECT_OK(created);
  if (!created.ok()) return result;
  Offloader& offloader = **created;
  const int64_t start = sim->NowNs();
  std::vector<std::vector<SavedTensor>> handles(layers);
  LayerLoopHooks hooks;
  hooks.forward = [&](int layer) -> Status {
    for (int i = 0; i < 2; ++i) {
      OFFLOAD_ASSIGN_OR_RETURN(
          Tensor t, Produce(*sim, DType::kF32, {256 * 1024}, 10 * layer + i,
                            i == 0 ? forward_ns : 0));
      OFFLOAD_ASSIGN_OR_RETURN(SavedTensor handle, offloader.Push(t));
      handles[layer].push_back(std::move(handle));
    }
    return OkStatus();
  };
  hooks.backward = [&](int layer) -> Status {
    std::vector<Tensor> popped;
    for (const SavedTensor& handle : handles[layer]) {
      OFFLOAD_ASSIGN_OR_RETURN(Tensor t, offloader.Pop(handle));
      popped.push_back(std::move(t));
    }
    OFFLOAD_RETURN_IF_ERROR(Consume(*sim, popped, backward_ns));
    handles[layer].clear();
    return OkStatus();
  };
  EXPECT_OK(RunLayerStep(offloader, layers, hooks));
  sim->RunUntilIdle();
  result.step_ns = sim->NowNs() - start;
  result.peak_bytes = sim->device_memory().peak_bytes;
  result.bytes_offloaded = offloader.stats().bytes_offloaded;
  result.bytes_reloaded = offloader.stats().bytes_reloaded;
  EXPECT_THAT(sim->hazards(), IsEmpty());
  return result;
}

// Compute-bound (forward 500 us, backward 1 ms per layer; a layer's 2 MiB
// copy in about 40 us): with n = 4, k = 2, layer i's copies start when its
// forward kernel ends and finish long before layer 2+i's forward, where the
// compute stream waits for them; a reload starts when the backward of the
// layer after it begins and is back long before its own backward. So no
// kernel ever waits and the step takes exactly 4 * (500 us + 1 ms), as
// without offloading, while the high-water mark drops to the n-k = 2
// resident layers of SPEC §6.2.
TEST_F(OffloaderTest, OffloadOverlapsComputeWhenComputeBound) {
  constexpr int64_t kForward = 500'000, kBackward = 1'000'000;
  constexpr int64_t kLayerBytes = 2 * kMiB;
  const StepResult without = TimedStep(SimOptions{}, 4, 0, kForward, kBackward);
  const StepResult with = TimedStep(SimOptions{}, 4, 2, kForward, kBackward);
  EXPECT_EQ(without.step_ns, 4 * (kForward + kBackward));
  EXPECT_EQ(with.step_ns, without.step_ns);
  EXPECT_EQ(with.bytes_offloaded, 2 * kLayerBytes);
  EXPECT_EQ(with.bytes_reloaded, 2 * kLayerBytes);
  EXPECT_EQ(without.peak_bytes, 4 * kLayerBytes);
  EXPECT_EQ(with.peak_bytes, 2 * kLayerBytes);
}

// The same measurement is sensitive: with copies slower than compute
// (0.5 GB/s: a layer's 2 MiB take over 4 ms) the compute stream stalls at
// the release points and the step takes longer than without offloading.
TEST_F(OffloaderTest, OffloadStallsComputeWhenCopyBound) {
  constexpr int64_t kForward = 500'000, kBackward = 1'000'000;
  SimOptions slow;
  slow.d2h_gbps = 0.5;
  slow.h2d_gbps = 0.5;
  const StepResult without = TimedStep(slow, 4, 0, kForward, kBackward);
  const StepResult with = TimedStep(slow, 4, 2, kForward, kBackward);
  EXPECT_EQ(without.step_ns, 4 * (kForward + kBackward));
  EXPECT_GT(with.step_ns, without.step_ns);
}

// SPEC §6.6: the same calls give an identical trace.
TEST_F(OffloaderTest, SameCallsGiveAnIdenticalTrace) {
  auto trace_of = [](int layers, int offloaded) {
    std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
    std::string text;
    {
      StatusOr<std::unique_ptr<Offloader>> created =
          Offloader::Create(*sim, DefaultOptions(layers, offloaded));
      EXPECT_OK(created);
      if (!created.ok()) return text;
      Offloader& offloader = **created;
      std::vector<std::vector<SavedTensor>> handles(layers);
      for (int layer = 0; layer < layers; ++layer) {
        EXPECT_OK(offloader.ForwardStep());
        StatusOr<Tensor> t = Produce(*sim, DType::kBF16, {512, 1024}, layer, 7);
        EXPECT_OK(t);
        if (!t.ok()) return text;
        StatusOr<SavedTensor> handle = offloader.Push(*t);
        EXPECT_OK(handle);
        if (handle.ok()) handles[layer].push_back(*std::move(handle));
      }
      for (int layer = layers - 1; layer >= 0; --layer) {
        EXPECT_OK(offloader.BackwardStep(layer));
        for (const SavedTensor& handle : handles[layer]) {
          StatusOr<Tensor> t = offloader.Pop(handle);
          EXPECT_OK(t);
          if (t.ok()) {
            EXPECT_OK(Consume(*sim, {*t}, 11));
          }
        }
        handles[layer].clear();
      }
      EXPECT_OK(offloader.FinishBackward());
      sim->RunUntilIdle();
      EXPECT_THAT(sim->hazards(), IsEmpty());
    }
    text = sim->TraceText();
    return text;
  };
  const std::string first = trace_of(4, 2);
  EXPECT_THAT(first, HasSubstr("pinned#"));
  EXPECT_EQ(trace_of(4, 2), first);
}

}  // namespace
}  // namespace offload_test
}  // namespace offload
