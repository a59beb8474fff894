// The Offloader's error paths (SPEC §3.6, §4.6, the comments of
// engine/offload.h), pinned-buffer retention, and faults (SPEC §6.7), on the
// simulated GPU. A failed call names the layer (and state) involved and
// changes nothing: no state, statistic, warning, allocation or enqueued
// operation.
//
// Every test ends by checking that the hazard detector found nothing
// (SimOffloadTest::TearDown), after the test's tensors and its Offloader
// were destroyed.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "testing/offload_test_util.h"
#include "engine/schedule.h"
#include "engine/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace offload_test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kElements = 256 * 1024;  // f32: 1 MiB, offloadable

class OffloaderErrorTest : public SimOffloadTest {
 protected:
  // Pushes a fresh 1 MiB f32 tensor of pattern `seed` in the open layer and
  // drops the test's own reference.
  StatusOr<SavedTensor> PushNew(Offloader& offloader, uint64_t seed) {
    OFFLOAD_ASSIGN_OR_RETURN(
        Tensor t, MakeDeviceTensor(*sim_, DType::kF32, {kElements}, seed));
    return offloader.Push(t);
  }

  // Pops `handle`, checks it holds pattern `seed`, and reads it in a
  // backward kernel.
  void ExpectPops(Offloader& offloader, const SavedTensor& handle,
                  uint64_t seed) {
    ASSERT_OK_AND_ASSIGN(Tensor t, offloader.Pop(handle));
    EXPECT_EQ(t.shape, (std::vector<int64_t>{kElements}));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadTensorBytes(*sim_, t));
    EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, 4 * kElements, seed)));
    ASSERT_OK(Consume(*sim_, {t}));
  }

  std::string State(const Offloader& offloader, int layers) {
    return Snapshot(offloader, *sim_, layers);
  }
};

// ------------------------------------------------------------ Create

TEST_F(OffloaderErrorTest, CreateRejectsOffloadingAllLayersOrMore) {
  EXPECT_THAT(Offloader::Create(*sim_, DefaultOptions(4, 4)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Offloader::Create(*sim_, DefaultOptions(4, 7)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Offloader::Create(*sim_, DefaultOptions(1, 1)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Offloader::Create(*sim_, DefaultOptions(4, -1)),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(OffloaderErrorTest, CreateWarnsWhenAllButOneLayerIsOffloaded) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> all_but_one,
                       Offloader::Create(*sim_, DefaultOptions(4, 3)));
  EXPECT_THAT(all_but_one->diagnostics().warnings(), SizeIs(1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> fewer,
                       Offloader::Create(*sim_, DefaultOptions(4, 2)));
  EXPECT_THAT(fewer->diagnostics().warnings(), IsEmpty());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> none,
                       Offloader::Create(*sim_, DefaultOptions(1, 0)));
  EXPECT_THAT(none->diagnostics().warnings(), IsEmpty());
}

TEST_F(OffloaderErrorTest, CreateRejectsInconsistentOptions) {
  OffloadOptions no_layers = DefaultOptions(0, 0);
  EXPECT_THAT(Offloader::Create(*sim_, no_layers),
              StatusIs(StatusCode::kInvalidArgument));
  OffloadOptions negative_min = DefaultOptions(4, 1);
  negative_min.min_offload_elements = -1;
  EXPECT_THAT(Offloader::Create(*sim_, negative_min),
              StatusIs(StatusCode::kInvalidArgument));
  OffloadOptions coverage = DefaultOptions(4, 1);
  coverage.min_span_coverage = 1.5;
  EXPECT_THAT(Offloader::Create(*sim_, coverage),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(OffloaderErrorTest, CreateRejectsOffloadStreamWithoutManualSync) {
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  OffloadOptions options = DefaultOptions(4, 1);
  options.offload_stream = side;
  EXPECT_THAT(Offloader::Create(*sim_, options),
              StatusIs(StatusCode::kInvalidArgument));
  options.manual_synchronization = true;
  EXPECT_OK(Offloader::Create(*sim_, options));
}

TEST_F(OffloaderErrorTest, CreateRejectsAnInvalidScheduleTable) {
  OffloadOptions options = DefaultOptions(4, 1);
  // Layer 2 reloaded at the third backward (step 7), after its own backward
  // began (step 6).
  options.schedule = ScheduleTable{{0, ScheduleEntry{true, 2, false, 4}},
                                   {2, ScheduleEntry{true, 4, false, 3}}};
  EXPECT_THAT(Offloader::Create(*sim_, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  options.schedule = ScheduleTable{{4, ScheduleEntry{true, 4, false, 1}}};
  EXPECT_THAT(Offloader::Create(*sim_, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 4")));
}

// ------------------------------------------------------------ disabled

// SPEC §4.6: disabled, every call passes through: Pop gives back the very
// tensor pushed, and nothing touches a stream or memory.
TEST_F(OffloaderErrorTest, DisabledOffloaderPassesEverythingThrough) {
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       MakeDeviceTensor(*sim_, DType::kF32, {kElements}, 1));
  CompositeTensor c;
  c.components = {x, std::nullopt};
  c.metadata = {9};
  sim_->RunUntilIdle();
  const size_t trace_before = sim_->trace().size();
  const int64_t device_allocations = sim_->device_memory().allocations;
  const int64_t pinned_allocations = sim_->pinned_memory().allocations;

  OffloadOptions options = DefaultOptions(3, 2);
  options.enabled = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  for (int iteration = 0; iteration < 2; ++iteration) {
    std::vector<SavedTensor> plain, composite;
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
      EXPECT_FALSE(offloader->WillOffload(layer));
      ASSERT_OK_AND_ASSIGN(SavedTensor p, offloader->Push(x));
      EXPECT_FALSE(p.in_group());
      plain.push_back(std::move(p));
      ASSERT_OK_AND_ASSIGN(SavedTensor q, offloader->Push(c));
      composite.push_back(std::move(q));
    }
    for (int layer = 2; layer >= 0; --layer) {
      ASSERT_OK(offloader->BackwardStep(layer));
      ASSERT_OK_AND_ASSIGN(Tensor t, offloader->Pop(plain[layer]));
      EXPECT_EQ(t.storage.get(), x.storage.get());
      ASSERT_OK_AND_ASSIGN(CompositeTensor d,
                           offloader->PopComposite(composite[layer]));
      ASSERT_THAT(d.components, SizeIs(2));
      ASSERT_TRUE(d.components[0].has_value());
      EXPECT_EQ(d.components[0]->storage.get(), x.storage.get());
      EXPECT_FALSE(d.components[1].has_value());
      EXPECT_EQ(d.metadata, c.metadata);
    }
    ASSERT_OK(offloader->FinishBackward());
  }
  EXPECT_EQ(sim_->trace().size(), trace_before);
  EXPECT_EQ(sim_->device_memory().allocations, device_allocations);
  EXPECT_EQ(sim_->pinned_memory().allocations, pinned_allocations);
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  EXPECT_EQ(offloader->stats().tensors_offloaded, 0);
  EXPECT_EQ(offloader->stats().spans_offloaded, 0);
  EXPECT_EQ(offloader->state(0), GroupState::kNotOffloaded);
}

// ------------------------------------------------------------ manual calls

TEST_F(OffloaderErrorTest, ManualCallsWithoutManualSynchronizationFail) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  const std::string before = State(*offloader, 3);
  EXPECT_THAT(offloader->StartOffload(1),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(offloader->ReleaseForwardMemory(0),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(offloader->StartReload(0),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(State(*offloader, 3), before);
  // The schedule still runs the step.
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, h0, 1));
  ASSERT_OK(offloader->FinishBackward());
}

// SPEC §3.6: each manual call in the wrong state fails with
// kFailedPrecondition naming the call, the layer and its state, and changes
// nothing; the group then completes its life cycle normally.
TEST_F(OffloaderErrorTest, WrongStateManualCallsNameLayerAndStateAndChangeNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(3)));
  std::vector<SavedTensor> handles;
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, PushNew(*offloader, 10 + layer));
    handles.push_back(std::move(h));
  }
  auto wrong = [](const std::string& call, const std::string& state) {
    return StatusIs(StatusCode::kFailedPrecondition,
                    AllOf(HasSubstr(call), HasSubstr("layer 1"),
                          HasSubstr(state)));
  };
  std::string snapshot = State(*offloader, 3);
  EXPECT_THAT(offloader->ReleaseForwardMemory(1),
              wrong("ReleaseForwardMemory", "not_offloaded"));
  EXPECT_THAT(offloader->StartReload(1), wrong("StartReload", "not_offloaded"));
  EXPECT_EQ(State(*offloader, 3), snapshot);

  ASSERT_OK(offloader->StartOffload(1));
  snapshot = State(*offloader, 3);
  EXPECT_THAT(offloader->StartOffload(1),
              wrong("StartOffload", "offload_started"));
  EXPECT_THAT(offloader->StartReload(1), wrong("StartReload", "offload_started"));
  EXPECT_EQ(State(*offloader, 3), snapshot);

  ASSERT_OK(offloader->ReleaseForwardMemory(1));
  snapshot = State(*offloader, 3);
  EXPECT_THAT(offloader->StartOffload(1),
              wrong("StartOffload", "offload_finished"));
  EXPECT_THAT(offloader->ReleaseForwardMemory(1),
              wrong("ReleaseForwardMemory", "offload_finished"));
  EXPECT_EQ(State(*offloader, 3), snapshot);

  ASSERT_OK(offloader->StartReload(1));
  snapshot = State(*offloader, 3);
  EXPECT_THAT(offloader->StartReload(1), wrong("StartReload", "reload_started"));
  EXPECT_THAT(offloader->StartOffload(1),
              wrong("StartOffload", "reload_started"));
  EXPECT_THAT(offloader->ReleaseForwardMemory(1),
              wrong("ReleaseForwardMemory", "reload_started"));
  EXPECT_EQ(State(*offloader, 3), snapshot);

  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[2], 12));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[1], 11));
  ASSERT_OK(offloader->BackwardStep(0));  // layer 1 released
  EXPECT_EQ(offloader->state(1), GroupState::kReleased);
  snapshot = State(*offloader, 3);
  EXPECT_THAT(offloader->StartReload(1), wrong("StartReload", "released"));
  EXPECT_EQ(State(*offloader, 3), snapshot);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[0], 10));
  ASSERT_OK(offloader->FinishBackward());
}

TEST_F(OffloaderErrorTest, ManualCallsOnLayersWithoutAForwardFail) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(3)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  const std::string before = State(*offloader, 3);
  EXPECT_THAT(offloader->StartOffload(1),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 1")));
  EXPECT_THAT(offloader->StartOffload(3),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 3")));
  EXPECT_THAT(offloader->StartReload(-1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer -1")));
  EXPECT_EQ(State(*offloader, 3), before);
}

// StartOffload of the layer still collecting pushes closes its forward (as
// leaving TE's offload context does): a later push is refused instead of
// landing in a group whose copies already started.
TEST_F(OffloaderErrorTest, PushAfterStartOffloadOfTheOpenLayerFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(2)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  ASSERT_OK(offloader->StartOffload(0));
  ASSERT_OK_AND_ASSIGN(Tensor late,
                       MakeDeviceTensor(*sim_, DType::kF32, {kElements}, 2));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Push(late), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->ReleaseForwardMemory(0));
  ASSERT_OK(offloader->StartReload(0));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, h0, 1));
  ASSERT_OK(offloader->FinishBackward());
}

// ------------------------------------------------------------ Push

TEST_F(OffloaderErrorTest, PushWithNoOpenLayerFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       MakeDeviceTensor(*sim_, DType::kF32, {kElements}, 1));
  std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Push(x), StatusIs(StatusCode::kFailedPrecondition));
  CompositeTensor c;
  c.components = {x};
  EXPECT_THAT(offloader->Push(c), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(State(*offloader, 2), before);

  // After an iteration ends, nothing is open until the next ForwardStep.
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK(offloader->FinishBackward());
  before = State(*offloader, 2);
  EXPECT_THAT(offloader->Push(x), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(State(*offloader, 2), before);
}

TEST_F(OffloaderErrorTest, PushOfAMalformedTensorFailsAndChangesNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor good,
                       MakeDeviceTensor(*sim_, DType::kF32, {kElements}, 1));
  Tensor bad = good;
  bad.name = "overhanging";
  bad.offset = 1;  // one element past the storage's end
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Push(bad),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overhanging")));
  // A composite with one bad component adds none of its components.
  CompositeTensor c;
  c.name = "fp8";
  c.components = {good, bad};
  EXPECT_THAT(offloader->Push(c), StatusIs(StatusCode::kInvalidArgument,
                                           HasSubstr("overhanging")));
  EXPECT_EQ(State(*offloader, 2), before);
}

// ------------------------------------------------------------ steps

TEST_F(OffloaderErrorTest, ForwardStepBeyondTheModelLayersFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->ForwardStep(),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, h0, 1));
  ASSERT_OK(offloader->FinishBackward());
  EXPECT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));  // next iteration
}

TEST_F(OffloaderErrorTest, BackwardStepOutOfRangeFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->BackwardStep(2),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  EXPECT_THAT(offloader->BackwardStep(-1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer -1")));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, h0, 1));
  ASSERT_OK(offloader->FinishBackward());
}

TEST_F(OffloaderErrorTest, BackwardStepTwiceFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  std::vector<SavedTensor> handles;
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, PushNew(*offloader, 20 + layer));
    handles.push_back(std::move(h));
  }
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));  // layer 0's reload starts here
  const std::string before = State(*offloader, 3);
  EXPECT_THAT(offloader->BackwardStep(1),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 1")));
  EXPECT_THAT(offloader->BackwardStep(2),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 2")));
  EXPECT_EQ(State(*offloader, 3), before);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[1], 21));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[0], 20));
  ASSERT_OK(offloader->FinishBackward());
}

TEST_F(OffloaderErrorTest, BackwardStepBeforeItsForwardFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  EXPECT_THAT(offloader->BackwardStep(0),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 0")));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  const std::string before = State(*offloader, 3);
  EXPECT_THAT(offloader->BackwardStep(2),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 2")));
  EXPECT_EQ(State(*offloader, 3), before);
}

// ------------------------------------------------------------ Pop

TEST_F(OffloaderErrorTest, PopOfAHandleFromAnotherOffloaderFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> a,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> b,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(a->ForwardStep(), IsOkAndHolds(0));
  ASSERT_THAT(b->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor from_a, PushNew(*a, 1));
  ASSERT_OK_AND_ASSIGN(SavedTensor from_b, PushNew(*b, 2));
  ASSERT_TRUE(from_a.in_group());
  for (Offloader* o : {a.get(), b.get()}) {
    ASSERT_THAT(o->ForwardStep(), IsOkAndHolds(1));
    ASSERT_OK(o->BackwardStep(1));
    ASSERT_OK(o->BackwardStep(0));
  }
  const std::string before = Snapshot(*b, *sim_, 2);
  EXPECT_THAT(b->Pop(from_a), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(a->Pop(from_b), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(Snapshot(*b, *sim_, 2), before);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*a, from_a, 1));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*b, from_b, 2));
  ASSERT_OK(a->FinishBackward());
  ASSERT_OK(b->FinishBackward());
}

TEST_F(OffloaderErrorTest, PopOfAHandleFromAPreviousIterationFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor old_handle, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, old_handle, 1));
  ASSERT_OK(offloader->FinishBackward());

  // Iteration 2: the same layer, the same position in its group.
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor new_handle, PushNew(*offloader, 2));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Pop(old_handle),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("iteration")));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, new_handle, 2));
  ASSERT_OK(offloader->FinishBackward());
}

TEST_F(OffloaderErrorTest, PopAndPopCompositeRefuseTheOtherKind) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor plain, PushNew(*offloader, 1));
  SavedTensor composite;
  {
    ASSERT_OK_AND_ASSIGN(Tensor x,
                         MakeDeviceTensor(*sim_, DType::kF32, {kElements}, 2));
    CompositeTensor c;
    c.name = "fp8";
    c.components = {x};
    ASSERT_OK_AND_ASSIGN(composite, offloader->Push(c));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Pop(composite), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(offloader->PopComposite(plain),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(offloader->Pop(SavedTensor()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, plain, 1));
  ASSERT_OK_AND_ASSIGN(CompositeTensor c, offloader->PopComposite(composite));
  ASSERT_THAT(c.components, SizeIs(1));
  ASSERT_TRUE(c.components[0].has_value());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                       ReadTensorBytes(*sim_, *c.components[0]));
  EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, 4 * kElements, 2)));
  ASSERT_OK(offloader->FinishBackward());
}

// Manual mode: the group's memory was released and its reload never
// started, so its tensors are nowhere on device; Pop says so (naming the
// layer) and works once the reload started.
TEST_F(OffloaderErrorTest, PopBeforeTheReloadStartedFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, ManualOptions(2)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK(offloader->StartOffload(0));
  ASSERT_OK(offloader->ReleaseForwardMemory(0));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  const std::string before = State(*offloader, 2);
  EXPECT_THAT(offloader->Pop(h0),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 0")));
  EXPECT_EQ(State(*offloader, 2), before);
  ASSERT_OK(offloader->StartReload(0));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, h0, 1));
  ASSERT_OK(offloader->FinishBackward());
}

// A group is released when the next backward step begins; its handles are
// dead then.
TEST_F(OffloaderErrorTest, PopAfterTheGroupWasReleasedFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 2)));
  std::vector<SavedTensor> handles;
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, PushNew(*offloader, 30 + layer));
    handles.push_back(std::move(h));
  }
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[1], 31));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_EQ(offloader->state(1), GroupState::kReleased);
  const std::string before = State(*offloader, 3);
  EXPECT_THAT(offloader->Pop(handles[1]),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 1")));
  EXPECT_EQ(State(*offloader, 3), before);
  ASSERT_NO_FATAL_FAILURE(ExpectPops(*offloader, handles[0], 30));
  ASSERT_OK(offloader->FinishBackward());
}

// ------------------------------------------------ retain_pinned_buffers

// One step of 3 layers, each saving one f32 tensor of `elements[layer]`
// elements of pattern 100 * iteration + layer, made by a kernel (no pinned
// staging); every popped byte is checked on the host.
class RetainTest : public OffloaderErrorTest {
 protected:
  void Step(Offloader& offloader, int iteration,
            const std::vector<int64_t>& elements) {
    const int layers = static_cast<int>(elements.size());
    std::vector<SavedTensor> handles;
    for (int layer = 0; layer < layers; ++layer) {
      ASSERT_THAT(offloader.ForwardStep(), IsOkAndHolds(layer));
      ASSERT_OK_AND_ASSIGN(
          Tensor t, Produce(*sim_, DType::kF32, {elements[layer]},
                            100 * iteration + layer));
      ASSERT_OK_AND_ASSIGN(SavedTensor h, offloader.Push(t));
      handles.push_back(std::move(h));
    }
    for (int layer = layers - 1; layer >= 0; --layer) {
      ASSERT_OK(offloader.BackwardStep(layer));
      ASSERT_OK_AND_ASSIGN(Tensor t, offloader.Pop(handles[layer]));
      ASSERT_OK(Consume(*sim_, {t}));
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, t));
      EXPECT_TRUE(BytesEqual(
          bytes, PatternBytes(0, 4 * elements[layer], 100 * iteration + layer)))
          << "iteration " << iteration << " layer " << layer;
    }
    ASSERT_OK(offloader.FinishBackward());
  }
};

TEST_F(RetainTest, SecondIterationMakesNoNewPinnedAllocations) {
  OffloadOptions options = DefaultOptions(3, 2);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  const std::vector<int64_t> elements = {kElements, 2 * kElements, kElements};
  ASSERT_NO_FATAL_FAILURE(Step(*offloader, 1, elements));
  sim_->RunUntilIdle();
  const int64_t engine_allocations = offloader->stats().pinned_allocations;
  const int64_t sim_allocations = sim_->pinned_memory().allocations;
  EXPECT_EQ(engine_allocations, 2);
  EXPECT_EQ(sim_allocations, 2);
  // Retained buffers still count as host bytes held.
  EXPECT_EQ(offloader->OffloadedBytes(), 3 * kMiB);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 3 * kMiB);

  ASSERT_NO_FATAL_FAILURE(Step(*offloader, 2, elements));
  ASSERT_NO_FATAL_FAILURE(Step(*offloader, 3, elements));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->stats().pinned_allocations, engine_allocations);
  EXPECT_EQ(sim_->pinned_memory().allocations, sim_allocations);
  EXPECT_EQ(offloader->stats().bytes_offloaded, 3 * 3 * kMiB);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 3 * kMiB);
}

// Without retention, pinned buffers are returned after each step.
TEST_F(RetainTest, WithoutRetentionPinnedMemoryIsReturnedAfterEachStep) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 2)));
  const std::vector<int64_t> elements = {kElements, kElements, kElements};
  ASSERT_NO_FATAL_FAILURE(Step(*offloader, 1, elements));
  ASSERT_NO_FATAL_FAILURE(Step(*offloader, 2, elements));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(offloader->stats().pinned_allocations, 4);
}

// SPEC §3.5, TE's rule: with retain_pinned_buffers, saved tensors that change
// shape between iterations are an error naming the layer (TE raises
// ValueError) — never a silent overflow of the old buffer. It must not stick
// (issue 9: an old version failed every later step until destruction): the
// layer stays on device for that iteration with correct bytes, the call that
// failed can be retried, and the next iteration re-plans without an error.
TEST_F(RetainTest, ShapeChangeBetweenIterationsIsAnErrorThatDoesNotStick) {
  OffloadOptions options = DefaultOptions(3, 1);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  ASSERT_NO_FATAL_FAILURE(
      Step(*offloader, 1, {kElements, kElements, kElements}));
  EXPECT_EQ(offloader->stats().pinned_allocations, 1);
  // Iteration 2: layer 0 saves a tensor twice as large.
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor big,
                       Produce(*sim_, DType::kF32, {2 * kElements}, 200));
  ASSERT_OK_AND_ASSIGN(SavedTensor h0, offloader->Push(big));
  big = Tensor();
  EXPECT_THAT(offloader->ForwardStep(),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("layer 0"),
                             HasSubstr("retain_pinned_buffers"),
                             HasSubstr("shapes"))));
  EXPECT_EQ(offloader->state(0), GroupState::kKeptOnDevice);
  EXPECT_EQ(offloader->stats().pinned_allocations, 1);
  // No layer is open until the retry (offload.h's ForwardStep).
  ASSERT_OK_AND_ASSIGN(Tensor late, Produce(*sim_, DType::kF32, {16}, 1));
  EXPECT_THAT(offloader->Push(late), StatusIs(StatusCode::kFailedPrecondition));
  // The retry does what is left: layer 1 starts.
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  for (int layer = 2; layer >= 0; --layer) ASSERT_OK(offloader->BackwardStep(layer));
  ASSERT_OK_AND_ASSIGN(Tensor back, offloader->Pop(h0));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, back));
  EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, 8 * kElements, 200)));
  back = Tensor();
  ASSERT_OK(offloader->FinishBackward());
  EXPECT_EQ(offloader->OffloadedBytes(), 0);  // the old buffer went back
  // Iteration 3 re-plans (no error) and retains the new buffers;
  // iteration 4 allocates nothing.
  ASSERT_NO_FATAL_FAILURE(
      Step(*offloader, 3, {2 * kElements, kElements, kElements}));
  EXPECT_EQ(offloader->stats().pinned_allocations, 2);
  ASSERT_NO_FATAL_FAILURE(
      Step(*offloader, 4, {2 * kElements, kElements, kElements}));
  EXPECT_EQ(offloader->stats().pinned_allocations, 2);
  EXPECT_EQ(offloader->OffloadedBytes(), 2 * kElements * 4);
  offloader.reset();
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

// The same in manual mode: StartOffload of the changed layer is the error.
TEST_F(RetainTest, ManualStartOffloadOfAChangedLayerIsTheError) {
  OffloadOptions options = ManualOptions(2);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  for (int iteration = 1; iteration <= 3; ++iteration) {
    const int64_t elements = iteration == 1 ? kElements : 2 * kElements;
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
    ASSERT_OK_AND_ASSIGN(Tensor t, Produce(*sim_, DType::kF32, {elements},
                                           10 + iteration));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, offloader->Push(t));
    t = Tensor();
    Status started = offloader->StartOffload(0);
    if (iteration == 2) {
      EXPECT_THAT(started, StatusIs(StatusCode::kInvalidArgument,
                                    HasSubstr("layer 0")));
      EXPECT_EQ(offloader->state(0), GroupState::kKeptOnDevice);
      EXPECT_FALSE(offloader->Push(t).ok());  // closed: no layer open
    } else {
      ASSERT_OK(started);
    }
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
    ASSERT_OK(offloader->ReleaseForwardMemory(0));
    ASSERT_OK(offloader->BackwardStep(1));
    ASSERT_OK(offloader->StartReload(0));
    ASSERT_OK(offloader->BackwardStep(0));
    ASSERT_OK_AND_ASSIGN(Tensor back, offloader->Pop(h));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, back));
    EXPECT_TRUE(
        BytesEqual(bytes, PatternBytes(0, 4 * elements, 10 + iteration)));
    back = Tensor();
    ASSERT_OK(offloader->FinishBackward());
  }
  EXPECT_EQ(offloader->stats().pinned_allocations, 2);
  offloader.reset();
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

// An iteration in which a retained layer saves nothing (issue 9: used to
// fail every later step): it goes through, and the next iteration reuses the
// buffers again.
TEST_F(RetainTest, IterationInWhichARetainedLayerSavesNothing) {
  OffloadOptions options = DefaultOptions(3, 1);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  ASSERT_NO_FATAL_FAILURE(
      Step(*offloader, 1, {kElements, kElements, kElements}));
  // Iteration 2: layer 0 pushes nothing.
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
  }
  for (int layer = 2; layer >= 0; --layer) {
    ASSERT_OK(offloader->BackwardStep(layer));
  }
  ASSERT_OK(offloader->FinishBackward());
  ASSERT_NO_FATAL_FAILURE(
      Step(*offloader, 3, {kElements, kElements, kElements}));
  EXPECT_EQ(offloader->stats().pinned_allocations, 1);
}

// Autograd does not unpack every saved tensor (a branch whose gradient is not
// needed). A reloaded span nobody popped is still being written by its H2D
// copy when the group is released: freeing it, or reusing a retained pinned
// buffer in the next iteration, must wait for that copy. No host
// synchronization anywhere, so only stream order protects the memory.
// (Found a real bug: the span was freed on the compute stream without a
// wait for its reload when no Pop had made one.)
TEST_F(RetainTest, ReloadedTensorsThatAreNeverPoppedAreFreedSafely) {
  OffloadOptions options = DefaultOptions(3, 1);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  for (int iteration = 1; iteration <= 3; ++iteration) {
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
      ASSERT_OK_AND_ASSIGN(
          Tensor t, Produce(*sim_, DType::kF32, {kElements}, 10 * iteration,
                            1000));
      ASSERT_OK(offloader->Push(t).status());  // the handle is dropped
    }
    for (int layer = 2; layer >= 0; --layer) {
      ASSERT_OK(offloader->BackwardStep(layer));
      ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(),
                                    SimKernel{"backward", 1000, {}, {}, nullptr}));
    }
    ASSERT_OK(offloader->FinishBackward());
  }
  EXPECT_EQ(offloader->stats().bytes_reloaded, 3 * 4 * kElements);
  EXPECT_EQ(offloader->stats().pinned_allocations, 1);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

// ------------------------------------------------------------ faults

// SPEC §6.7: a pinned allocation that fails leaves the group on device, with
// a warning; the step completes with correct data and leaks nothing.
TEST_F(OffloaderErrorTest, PinnedMemoryShortageKeepsTheGroupOnDevice) {
  SimOptions sim_options;
  sim_options.pinned_capacity_bytes = kMiB;
  UseSim(sim_options);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  SavedTensor handle;
  {
    ASSERT_OK_AND_ASSIGN(Tensor t, Produce(*sim_, DType::kF32, {kMiB}, 5));
    ASSERT_OK_AND_ASSIGN(handle, offloader->Push(t));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));  // "release" step
  sim_->RunUntilIdle();
  EXPECT_GE(offloader->diagnostics().Count("layer 0"), 1);
  EXPECT_GE(offloader->diagnostics().Count("pinned"), 1);
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  EXPECT_EQ(sim_->device_memory().live_bytes, 4 * kMiB);  // still there
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  {
    ASSERT_OK_AND_ASSIGN(Tensor t, offloader->Pop(handle));
    ASSERT_OK(Consume(*sim_, {t}));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, t));
    EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, 4 * kMiB, 5)));
  }
  ASSERT_OK(offloader->FinishBackward());
  handle = SavedTensor();
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

// SPEC §6.7: when a reload cannot get device memory, BackwardStep returns
// kResourceExhausted naming the layer, changes nothing (the host copy stays,
// no device memory stays allocated), and succeeds once memory was freed.
// Layer 0 has two 2 MiB spans; with 5 MiB held elsewhere on an 8 MiB device
// the first fits and the second does not, so the first must be given back.
TEST_F(OffloaderErrorTest, ReloadWithoutDeviceMemoryFailsAndSucceedsOnRetry) {
  SimOptions sim_options;
  sim_options.device_capacity_bytes = 8 * kMiB;
  UseSim(sim_options);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(2, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  std::vector<SavedTensor> layer0;
  for (uint64_t seed : {1, 2}) {
    ASSERT_OK_AND_ASSIGN(Tensor t,
                         Produce(*sim_, DType::kF32, {2 * kElements}, seed));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, offloader->Push(t));
    layer0.push_back(std::move(h));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));  // layer 0 released
  {
    ASSERT_OK_AND_ASSIGN(Tensor t, Produce(*sim_, DType::kF32, {kMiB}, 3));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, offloader->Push(t));
    ASSERT_OK(offloader->BackwardStep(1));
    ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(h));
    ASSERT_OK(Consume(*sim_, {popped}));
  }
  sim_->RunUntilIdle();
  ASSERT_EQ(sim_->device_memory().live_bytes, 0);
  // Something else (a gradient, say) now holds 5 of the 8 MiB.
  ASSERT_OK_AND_ASSIGN(Buffer hog,
                       sim_->AllocateDevice(5 * kMiB, sim_->ComputeStream()));
  sim_->RunUntilIdle();
  // Layer 0's state, the statistics, host bytes and warnings. (Layer 1's
  // group may be released by the failed call: its backward is over, and
  // releasing it first is what frees memory for a reload.)
  const std::string before = Snapshot(*offloader, *sim_, /*layers=*/1,
                                      /*with_device_ops=*/false);
  EXPECT_THAT(offloader->BackwardStep(0),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("layer 0")));
  EXPECT_EQ(Snapshot(*offloader, *sim_, 1, /*with_device_ops=*/false), before);
  EXPECT_EQ(offloader->state(0), GroupState::kOffloadFinished);
  EXPECT_EQ(offloader->OffloadedBytes(), 4 * kMiB);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 5 * kMiB);

  hog = Buffer();  // freed on the compute stream
  ASSERT_OK(offloader->BackwardStep(0));
  EXPECT_EQ(offloader->state(0), GroupState::kReloadStarted);
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor t, offloader->Pop(layer0[i]));
    ASSERT_OK(Consume(*sim_, {t}));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, HostBytes(*sim_, t));
    EXPECT_TRUE(BytesEqual(bytes, PatternBytes(0, 8 * kElements, i + 1)));
  }
  ASSERT_OK(offloader->FinishBackward());
  layer0.clear();
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

// SPEC §6.4: destroying the Offloader while its copies are in flight must
// not free memory they still use (as cudaFreeHost and PyTorch's caching
// allocators guarantee); the hazard detector checks it at TearDown.
// (Found a real bug: ~Offloader dropped pinned buffers at once and device
// storages without waiting for the copies using them.)
TEST_F(OffloaderErrorTest, DestroyingTheOffloaderDuringAnOffloadIsSafe) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(SavedTensor h, PushNew(*offloader, 1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));  // D2H enqueued
  ASSERT_EQ(offloader->state(0), GroupState::kOffloadStarted);
  h = SavedTensor();
  offloader.reset();  // no synchronization by the test
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

// The same, with retained pinned buffers after a complete step (no
// synchronization by the caller).
TEST_F(OffloaderErrorTest, DestroyingTheOffloaderRightAfterAStepIsSafe) {
  OffloadOptions options = DefaultOptions(3, 2);
  options.retain_pinned_buffers = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  std::vector<SavedTensor> handles;
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
    ASSERT_OK_AND_ASSIGN(Tensor t,
                         Produce(*sim_, DType::kF32, {kElements}, layer));
    ASSERT_OK_AND_ASSIGN(SavedTensor h, offloader->Push(t));
    handles.push_back(std::move(h));
  }
  for (int layer = 2; layer >= 0; --layer) {
    ASSERT_OK(offloader->BackwardStep(layer));
    ASSERT_OK_AND_ASSIGN(Tensor t, offloader->Pop(handles[layer]));
    ASSERT_OK(Consume(*sim_, {t}, 1000));
  }
  ASSERT_OK(offloader->FinishBackward());
  handles.clear();
  offloader.reset();  // retained pinned buffers go; no synchronization
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

}  // namespace
}  // namespace offload_test
}  // namespace offload
