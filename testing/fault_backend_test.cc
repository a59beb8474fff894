#include "testing/fault_backend.h"

#include <memory>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/backend_conformance.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Without faults the wrapper is a conforming backend.
Status NoHazards(Backend& backend) {
  auto& fault = dynamic_cast<FaultInjectingBackend&>(backend);
  auto& sim = dynamic_cast<SimBackend&>(fault.inner());
  if (!sim.hazards().empty()) {
    return InternalError(sim.hazards()[0].ToString());
  }
  return fault.injected() == 0 ? OkStatus()
                               : InternalError("a fault was injected");
}

INSTANTIATE_TEST_SUITE_P(
    FaultOverSim, BackendConformanceTest,
    ::testing::Values(BackendFactory{
        "no_faults",
        [] {
          SimOptions options;
          options.device_capacity_bytes = int64_t{64} << 20;
          options.pinned_capacity_bytes = int64_t{64} << 20;
          return std::unique_ptr<Backend>(
              std::make_unique<FaultInjectingBackend>(NewSimBackend(options)));
        },
        NoHazards}),
    BackendFactoryName());

class FaultInjectingBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
  FaultInjectingBackend fault_{*sim_};
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

}  // namespace
}  // namespace offload
