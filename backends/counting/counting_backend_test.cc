#include "backends/counting/counting_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backends/sim/sim_backend.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

TEST(CountingBackendTest, CountsEachCallByKind) {
  SimBackend sim{SimOptions()};
  CountingBackend counting(sim);
  Stream& compute = counting.ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream * copy, counting.NewStream("copy"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, counting.NewEvent());
  ASSERT_OK_AND_ASSIGN(Buffer device, counting.AllocateDevice(64, compute));
  ASSERT_OK_AND_ASSIGN(Buffer pinned, counting.AllocatePinned(64));
  ASSERT_OK(copy->Wait(*event));
  ASSERT_OK(copy->Copy(pinned.data(), device.data(), 64));
  ASSERT_OK(copy->Record(*event));
  ASSERT_OK(compute.Wait(*event));
  ASSERT_OK(counting.Free(device, compute));
  ASSERT_OK(event->Synchronize());
  { Buffer dropped = std::move(pinned); }
  const CallCounts& c = counting.counts();
  EXPECT_EQ(c.new_event, 1);
  EXPECT_EQ(c.allocate_device, 1);
  EXPECT_EQ(c.allocate_pinned, 1);
  EXPECT_EQ(c.wait, 2);
  EXPECT_EQ(c.copy, 1);
  EXPECT_EQ(c.record, 1);
  EXPECT_EQ(c.free, 2);  // one Free, one dropped buffer
  EXPECT_EQ(c.synchronize, 1);
  EXPECT_EQ(c.total(), 10);
  EXPECT_EQ(CallCounts::Names().size(), c.Values().size());
  counting.Reset();
  EXPECT_EQ(counting.counts().total(), 0);
}

TEST(CountingBackendTest, CountsFailedCallsToo) {
  SimBackend sim{SimOptions()};
  CountingBackend counting(sim);
  EXPECT_FALSE(counting.AllocateDevice(-1, counting.ComputeStream()).ok());
  EXPECT_EQ(counting.counts().allocate_device, 1);
}

}  // namespace
}  // namespace offload
