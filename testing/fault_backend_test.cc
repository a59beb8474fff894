#include "testing/fault_backend.h"

#include <memory>
#include <string_view>

#include "backends/sim/sim_backend.h"
#include "engine/backend_wrapper.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/backend_conformance.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// With nothing injected the fault backend is a conforming backend, and so is
// a bare BackendWrapper (the base every decorator forwards through).
Status NoHazards(Backend& backend) {
  auto& wrapper = dynamic_cast<BackendWrapper&>(backend);
  auto& sim = dynamic_cast<SimBackend&>(wrapper.target());
  if (!sim.hazards().empty()) {
    return InternalError(sim.hazards()[0].ToString());
  }
  auto* fault = dynamic_cast<FaultInjectingBackend*>(&backend);
  return fault == nullptr || fault->injected() == 0
             ? OkStatus()
             : InternalError("a fault was injected");
}

std::unique_ptr<SimBackend> SmallSim() {
  SimOptions options;
  options.device_capacity_bytes = int64_t{64} << 20;
  options.pinned_capacity_bytes = int64_t{64} << 20;
  return NewSimBackend(options);
}

INSTANTIATE_TEST_SUITE_P(
    WrappersOverSim, BackendConformanceTest,
    ::testing::Values(
        BackendFactory{"no_faults",
                       [] {
                         return std::unique_ptr<Backend>(
                             std::make_unique<FaultInjectingBackend>(
                                 SmallSim()));
                       },
                       NoHazards},
        BackendFactory{"bare_wrapper",
                       [] {
                         return std::unique_ptr<Backend>(
                             std::make_unique<BackendWrapper>(SmallSim()));
                       },
                       NoHazards}),
    BackendFactoryName());

// A decorator that counts the calls that reach it: placed under the fault
// backend, it shows which calls a failure kept from the inner backend.
class CountingBackend final : public BackendWrapper {
 public:
  using BackendWrapper::BackendWrapper;

  int new_streams = 0, new_events = 0, records = 0, waits = 0;

  StatusOr<Stream*> NewStream(std::string_view name) override {
    ++new_streams;
    return BackendWrapper::NewStream(name);
  }
  StatusOr<std::unique_ptr<Event>> NewEvent() override {
    ++new_events;
    return BackendWrapper::NewEvent();
  }

 private:
  Status StreamRecord(Stream& stream, Event& event) override {
    ++records;
    return BackendWrapper::StreamRecord(stream, event);
  }
  Status StreamWait(Stream& stream, const Event& event) override {
    ++waits;
    return BackendWrapper::StreamWait(stream, event);
  }
};

class FaultInjectingBackendTest : public ::testing::Test {
 protected:
  // Counts the enqueued records and waits the simulator saw.
  int Enqueued(SimOpKind kind) {
    sim_->RunUntilIdle();
    int n = 0;
    for (const SimTraceEntry& entry : sim_->trace()) {
      n += entry.phase == SimPhase::kEnqueue && entry.kind == kind;
    }
    return n;
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
  CountingBackend counting_{*sim_};
  FaultInjectingBackend fault_{counting_};
};

TEST_F(FaultInjectingBackendTest, PinnedFailuresComeAfterTheSkippedOnes) {
  fault_.FailPinnedAllocations(/*skip=*/1, /*count=*/2);
  EXPECT_OK(fault_.AllocatePinned(64));
  EXPECT_THAT(fault_.AllocatePinned(64),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("injected")));
  EXPECT_THAT(fault_.AllocatePinned(64),
              StatusIs(StatusCode::kResourceExhausted));
  EXPECT_OK(fault_.AllocatePinned(64));
  EXPECT_EQ(fault_.injected(), 2);
  EXPECT_EQ(sim_->pinned_memory().allocations, 2);  // failures reach nothing
}

TEST_F(FaultInjectingBackendTest, DeviceAndCopyFailuresLeaveTheInnerUntouched) {
  Stream& compute = fault_.ComputeStream();
  fault_.FailDeviceAllocations(0);
  EXPECT_THAT(fault_.AllocateDevice(64, compute),
              StatusIs(StatusCode::kResourceExhausted));
  ASSERT_OK_AND_ASSIGN(Buffer device, fault_.AllocateDevice(64, compute));
  ASSERT_OK_AND_ASSIGN(Buffer host, fault_.AllocatePinned(64));
  fault_.FailCopies(/*skip=*/0, /*count=*/2);
  EXPECT_THAT(compute.Copy(device.data(), host.data(), 64),
              StatusIs(StatusCode::kInternal, HasSubstr("'compute'")));
  EXPECT_THAT(compute.Gather(device.data(), host.data(), 4, {16}, {1}),
              StatusIs(StatusCode::kInternal, HasSubstr("gather")));
  EXPECT_OK(compute.Copy(device.data(), host.data(), 64));  // count used up
  sim_->RunUntilIdle();
  int copies = 0, gathers = 0;
  for (const SimTraceEntry& entry : sim_->trace()) {
    if (entry.phase != SimPhase::kEnqueue) continue;
    copies += entry.kind == SimOpKind::kCopy;
    gathers += entry.kind == SimOpKind::kGather;
  }
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(gathers, 0);
  EXPECT_EQ(fault_.injected(), 3);
  EXPECT_EQ(sim_->device_memory().allocations, 1);
}

TEST_F(FaultInjectingBackendTest, BuffersBelongToTheWrapperAndFreeTheInner) {
  ASSERT_OK_AND_ASSIGN(Stream* side, fault_.NewStream("side"));
  ASSERT_OK_AND_ASSIGN(Buffer device, fault_.AllocateDevice(1024, *side));
  EXPECT_EQ(device.owner(), &fault_);
  EXPECT_EQ(device.stream(), side);
  ASSERT_OK(fault_.Free(device, *side));
  EXPECT_TRUE(device.empty());
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
  EXPECT_THAT(fault_.Free(device, *side), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(FaultInjectingBackendTest, StreamAndEventCreationFailuresCreateNothing) {
  fault_.FailNewStreams(/*skip=*/1);
  fault_.FailNewEvents(/*skip=*/0, /*count=*/2);
  EXPECT_THAT(fault_.NewEvent(),
              StatusIs(StatusCode::kInternal, HasSubstr("injected")));
  EXPECT_THAT(fault_.NewEvent(), StatusIs(StatusCode::kInternal));
  EXPECT_OK(fault_.NewEvent());
  EXPECT_OK(fault_.NewStream("first"));
  EXPECT_THAT(fault_.NewStream("second"),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("'second'")));
  ASSERT_OK_AND_ASSIGN(Stream* third, fault_.NewStream("third"));
  EXPECT_EQ(third->name(), "third");
  EXPECT_EQ(fault_.injected(), 3);
  EXPECT_EQ(counting_.new_events, 1);
  EXPECT_EQ(counting_.new_streams, 2);
}

TEST_F(FaultInjectingBackendTest, RecordAndWaitFailuresEnqueueNothing) {
  Stream& compute = fault_.ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* side, fault_.NewStream("side"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, fault_.NewEvent());
  fault_.FailRecords(/*skip=*/1);
  fault_.FailWaits(/*skip=*/0);
  EXPECT_OK(compute.Record(*event));
  EXPECT_THAT(compute.Record(*event),
              StatusIs(StatusCode::kInternal, HasSubstr("Record")));
  EXPECT_THAT(side->Wait(*event),
              StatusIs(StatusCode::kInternal, HasSubstr("'side'")));
  EXPECT_OK(side->Wait(*event));
  EXPECT_OK(compute.Record(*event));
  EXPECT_EQ(fault_.injected(), 2);
  EXPECT_EQ(counting_.records, 2);
  EXPECT_EQ(counting_.waits, 1);
  EXPECT_EQ(Enqueued(SimOpKind::kRecord), 2);
  EXPECT_EQ(Enqueued(SimOpKind::kWait), 1);
}

TEST_F(FaultInjectingBackendTest, ForeignEventsAreRejectedNotInjected) {
  FaultInjectingBackend other(NewSimBackend(SimOptions{}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> foreign, other.NewEvent());
  std::unique_ptr<Event> inner_event = *sim_->NewEvent();
  fault_.FailRecords(/*skip=*/0);
  fault_.FailWaits(/*skip=*/0);
  Stream& compute = fault_.ComputeStream();
  EXPECT_THAT(compute.Record(*foreign), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(compute.Wait(*inner_event),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(fault_.injected(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> own, fault_.NewEvent());
  EXPECT_THAT(compute.Record(*own), StatusIs(StatusCode::kInternal));
  EXPECT_THAT(compute.Wait(*own), StatusIs(StatusCode::kInternal));
  EXPECT_EQ(fault_.injected(), 2);
}

}  // namespace
}  // namespace offload
