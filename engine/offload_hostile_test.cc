// Hostile input and device faults (issue 9): each test fails on the engine
// before its fix. Foreign storages, events and streams are refused; the
// layer count is capped; frees of memory produced on another stream are
// ordered after the producer; a composite push is all or nothing; the exact
// partial effect of a failed ForwardStep; no offload once a layer's backward
// began.

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/fault_backend.h"
#include "testing/offload_test_util.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace offload_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kElements = 256 * 1024;

class HostileInputTest : public SimOffloadTest {};

TEST_F(HostileInputTest, StorageOfAnotherBackendIsRefusedAtPush) {
  std::unique_ptr<SimBackend> other = NewSimBackend(SimOptions{});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor foreign,
                       Produce(*other, DType::kF32, {kElements}, 1));
  foreign.name = "foreign";
  ASSERT_OK_AND_ASSIGN(Tensor own, Produce(*sim_, DType::kF32, {kElements}, 2));
  const std::string before = Snapshot(*offloader, *sim_, 3);
  EXPECT_THAT(offloader->Push(foreign),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'foreign'"), HasSubstr("layer 0"),
                             HasSubstr("another backend"))));
  // A composite with one foreign component pushes nothing.
  CompositeTensor composite;
  composite.name = "fp8";
  composite.components = {own, foreign};
  EXPECT_THAT(offloader->Push(composite),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("component 1"),
                             HasSubstr("another backend"))));
  EXPECT_EQ(Snapshot(*offloader, *sim_, 3), before);
  other->RunUntilIdle();
}

TEST_F(HostileInputTest, ReadyEventOfAnotherBackendIsRefusedAtPush) {
  std::unique_ptr<SimBackend> other = NewSimBackend(SimOptions{});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor t, Produce(*sim_, DType::kF32, {kElements}, 1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, other->NewEvent());
  t.ready = std::move(event);
  EXPECT_THAT(offloader->Push(t),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("ready event belongs to another backend")));
  // The offload still works for the layer (nothing was added).
  EXPECT_EQ(offloader->stats().tensors_offloaded, 0);
}

TEST_F(HostileInputTest, OffloadStreamOfAnotherBackendIsRefusedAtCreate) {
  std::unique_ptr<SimBackend> other = NewSimBackend(SimOptions{});
  ASSERT_OK_AND_ASSIGN(Stream * stream, other->NewStream("theirs"));
  OffloadOptions options = ManualOptions(2);
  options.offload_stream = stream;
  EXPECT_THAT(Offloader::Create(*sim_, options),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("offload_stream belongs to another backend")));
}

// 1e9 layers used to throw std::bad_alloc out of Create (216 B of state a
// layer, even when disabled); INT_MAX overflowed the step numbers.
TEST_F(HostileInputTest, LayerCountIsCappedAndCostsNothingUpFront) {
  for (int layers : {kMaxModelLayers + 1, 1'000'000'000, INT_MAX}) {
    OffloadOptions options = DefaultOptions(layers, 1);
    EXPECT_THAT(Offloader::Create(*sim_, options),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("model_layers must be at most")))
        << layers;
  }
  OffloadOptions disabled = DefaultOptions(kMaxModelLayers, 0);
  disabled.enabled = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, disabled));
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> manual,
                       Offloader::Create(*sim_, ManualOptions(kMaxModelLayers)));
  EXPECT_EQ(manual->state(kMaxModelLayers - 1), GroupState::kNotOffloaded);
}

// A tensor written by a kernel on a side stream, pushed with the side
// stream's ready event and dropped by the caller. When no copy ever ordered
// it, the engine's release must still come after the producer, or the free
// on the compute stream races the kernel still writing it.
class ProducerOrderTest : public SimOffloadTest {
 protected:
  // A tensor allocated on the compute stream and written for 1 ms by a
  // kernel on `side`, with its ready event recorded there.
  Tensor ProduceOnSide(Stream& side, uint64_t seed) {
    Tensor t;
    t.dtype = DType::kF32;
    t.shape = {kElements};
    t.strides = {1};
    t.name = "side" + std::to_string(seed);
    Buffer buffer =
        *sim_->AllocateDevice(kElements * 4, sim_->ComputeStream());
    void* data = buffer.data();
    t.storage = std::make_shared<Storage>(std::move(buffer));
    std::shared_ptr<Event> allocated = *sim_->NewEvent();
    EXPECT_OK(sim_->ComputeStream().Record(*allocated));
    EXPECT_OK(side.Wait(*allocated));
    SimKernel kernel;
    kernel.name = "side producer";
    kernel.duration_ns = 1'000'000;
    kernel.writes = {{data, kElements * 4}};
    EXPECT_OK(sim_->EnqueueKernel(side, kernel));
    std::shared_ptr<Event> ready = *sim_->NewEvent();
    EXPECT_OK(side.Record(*ready));
    t.ready = ready;
    return t;
  }
};

TEST_F(ProducerOrderTest, OffloaderDestroyedBeforeTheOffloadStarts) {
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                         Offloader::Create(*sim_, DefaultOptions(3, 1)));
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
    ASSERT_OK(offloader->Push(ProduceOnSide(*side, 1)).status());
  }  // destroyed with layer 0 still open: no copy ever read the tensor
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

TEST_F(ProducerOrderTest, PinnedAllocationFailedAndNeverPopped) {
  SimOptions options;
  options.pinned_capacity_bytes = 1024;
  UseSim(options);
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK(offloader->Push(ProduceOnSide(*side, 2)).status());
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  EXPECT_EQ(offloader->state(0), GroupState::kKeptOnDevice);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  for (int layer = 2; layer >= 0; --layer) {
    ASSERT_OK(offloader->BackwardStep(layer));  // nothing popped
  }
  ASSERT_OK(offloader->FinishBackward());
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

TEST_F(ProducerOrderTest, SkippedSparseViewNeverPopped) {
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  OffloadOptions options = DefaultOptions(3, 1);
  options.skip_sparse_views = true;
  options.min_offload_elements = 1024;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  {
    Tensor base = ProduceOnSide(*side, 3);
    ASSERT_OK_AND_ASSIGN(Tensor sparse, Slice(base, 0, 0, kElements, 8));
    ASSERT_OK(offloader->Push(sparse).status());
  }
  for (int layer = 1; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
  }
  EXPECT_EQ(offloader->diagnostics().Count("skip_sparse_views"), 1);
  for (int layer = 2; layer >= 0; --layer) {
    ASSERT_OK(offloader->BackwardStep(layer));
  }
  ASSERT_OK(offloader->FinishBackward());
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

// A composite whose second component cannot be pushed (its ready point's
// Record fails) leaves nothing in the group, and a retry pushes it whole.
TEST(AtomicPushTest, FailedCompositePushAddsNothing) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  FaultInjectingBackend backend(*sim);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                         Offloader::Create(backend, DefaultOptions(3, 1)));
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
    ASSERT_OK_AND_ASSIGN(Tensor a, MakeDeviceTensor(backend, DType::kF32,
                                                    {kElements}, 1));
    ASSERT_OK_AND_ASSIGN(Tensor b, MakeDeviceTensor(backend, DType::kF32,
                                                    {kElements}, 2));
    CompositeTensor composite;
    composite.name = "fp8";
    composite.components = {a, b};
    const OffloaderStats before = offloader->stats();
    backend.FailRecords(/*skip=*/1, /*count=*/1);
    EXPECT_THAT(offloader->Push(composite),
                StatusIs(StatusCode::kInternal,
                         HasSubstr("no component was pushed")));
    EXPECT_EQ(offloader->stats().tensors_offloaded, before.tensors_offloaded);
    ASSERT_OK_AND_ASSIGN(SavedTensor saved, offloader->Push(composite));
    EXPECT_EQ(offloader->stats().tensors_offloaded,
              before.tensors_offloaded + 2);
    a = b = Tensor();
    composite = CompositeTensor();
    for (int layer = 1; layer < 3; ++layer) {
      ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    }
    // Exactly the two components were copied: one span each.
    EXPECT_EQ(offloader->stats().spans_offloaded, 2);
    for (int layer = 2; layer >= 0; --layer) {
      ASSERT_OK(offloader->BackwardStep(layer));
    }
    ASSERT_OK_AND_ASSIGN(CompositeTensor popped,
                         offloader->PopComposite(saved));
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                           ReadTensorBytes(backend, *popped.components[i]));
      EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, kElements * 4, i + 1)));
    }
    ASSERT_OK(offloader->FinishBackward());
  }
  sim->RunUntilIdle();
  EXPECT_THAT(sim->hazards(), ::testing::IsEmpty());
  EXPECT_EQ(sim->device_memory().live_bytes, 0);
}

// The documented partial effect of a failed ForwardStep: the previous
// layer's forward is closed (its offload started) and a retry returns the
// same layer id.
TEST(ForwardStepFailureTest, PreviousLayerIsClosedAndARetryGoesOn) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  FaultInjectingBackend backend(*sim);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                         Offloader::Create(backend, DefaultOptions(3, 1)));
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
    ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(backend, DType::kF32,
                                                    {kElements}, 1));
    ASSERT_OK_AND_ASSIGN(SavedTensor saved, offloader->Push(t));
    t = Tensor();
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
    // Layer 0 is released at the forward of layer 2: its Wait fails once.
    backend.FailWaits(/*skip=*/0, /*count=*/1);
    EXPECT_THAT(offloader->ForwardStep(),
                StatusIs(StatusCode::kInternal, HasSubstr("ForwardStep")));
    EXPECT_EQ(offloader->state(0), GroupState::kOffloadStarted);
    ASSERT_OK_AND_ASSIGN(Tensor late, MakeDeviceTensor(backend, DType::kF32,
                                                       {kElements}, 9));
    EXPECT_THAT(offloader->Push(late),
                StatusIs(StatusCode::kFailedPrecondition));  // none open
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
    EXPECT_EQ(offloader->state(0), GroupState::kOffloadFinished);
    for (int layer = 2; layer >= 0; --layer) {
      ASSERT_OK(offloader->BackwardStep(layer));
    }
    ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(saved));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                         ReadTensorBytes(backend, popped));
    EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, kElements * 4, 1)));
    popped = Tensor();
    ASSERT_OK(offloader->FinishBackward());
  }
  sim->RunUntilIdle();
  EXPECT_THAT(sim->hazards(), ::testing::IsEmpty());
}

TEST_F(HostileInputTest, StartOffloadAfterTheLayersBackwardBeganIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(2)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor t, Produce(*sim_, DType::kF32, {kElements}, 1));
  ASSERT_OK_AND_ASSIGN(SavedTensor saved, offloader->Push(t));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  EXPECT_THAT(offloader->StartOffload(0),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("layer 0"),
                             HasSubstr("backward already began"))));
  EXPECT_EQ(offloader->state(0), GroupState::kNotOffloaded);
  EXPECT_OK(offloader->Pop(saved).status());
}

}  // namespace
}  // namespace offload_test
}  // namespace offload
