// The backend calls an OffloadGroup makes (issue 11 item 4: host cost per
// offloaded tensor), with the guarantees they must keep: every byte comes
// back, a pop waits only for its own span's reload (SPEC §3.4), and no
// memory is freed before the work that uses it (the simulator's hazard
// detector).

#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backends/counting/counting_backend.h"
#include "backends/sim/sim_backend.h"
#include "engine/core/offload_core.h"
#include "engine/core/offload_group.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

constexpr int kTensors = 5;

class GroupCallsTest : public ::testing::Test {
 protected:
  GroupCallsTest() : sim_(SimOptions()), counting_(sim_) {
    d2h_ = counting_.NewStream("d2h").value();
    h2d_ = counting_.NewStream("h2d").value();
    core_ = std::make_unique<OffloadCore>(counting_, *d2h_, *h2d_,
                                          CoreOptions());
  }
  ~GroupCallsTest() override {
    group_.reset();
    core_.reset();
    sim_.RunUntilIdle();
    EXPECT_THAT(sim_.hazards(), ::testing::IsEmpty());
    EXPECT_EQ(sim_.device_memory().live_bytes, 0);
  }

  // kTensors tensors of their own storage, of f32 elements[i] each (by
  // default sizes that differ, all multiples of 256 bytes); their bytes in
  // expected_.
  std::vector<Tensor> MakeTensors() {
    std::vector<Tensor> tensors;
    expected_.clear();
    for (int i = 0; i < kTensors; ++i) {
      Tensor t = MakeDeviceTensor(counting_, DType::kF32, {elements_[i]},
                                  10 + i).value();
      expected_.push_back(ReadTensorBytes(counting_, t).value());
      tensors.push_back(std::move(t));
    }
    return tensors;
  }

  // Pushes MakeTensors() and offloads them; the caller's references go.
  // Counts start after the tensors are made.
  void PushAndOffload(bool retain = false) {
    if (group_ == nullptr) {
      group_ = std::make_unique<OffloadGroup>(*core_, "layer 0", 0);
    }
    std::vector<Tensor> tensors = MakeTensors();
    counting_.Reset();
    for (const Tensor& t : tensors) {
      ASSERT_OK(group_->AddPushed(t).status());
    }
    tensors.clear();
    ASSERT_OK(group_->StartOffload(retain));
    ASSERT_OK(group_->ReleaseForwardMemory());
  }

  SimBackend sim_;
  CountingBackend counting_;
  Stream* d2h_ = nullptr;
  Stream* h2d_ = nullptr;
  std::unique_ptr<OffloadCore> core_;
  std::unique_ptr<OffloadGroup> group_;
  std::vector<int64_t> elements_ = {1024, 1088, 1152, 1216, 1280};
  std::vector<std::vector<uint8_t>> expected_;
};

TEST_F(GroupCallsTest, OnePinnedAllocationPerGroup) {
  ASSERT_NO_FATAL_FAILURE(PushAndOffload());
  EXPECT_EQ(counting_.counts().allocate_pinned, 1);
  int64_t bytes = 0;
  for (int i = 0; i < kTensors; ++i) bytes += 4 * elements_[i];
  EXPECT_EQ(group_->host_bytes(), bytes);  // spans only, no padding
  ASSERT_OK(group_->StartReload());
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor t, group_->Pop(i));
    EXPECT_THAT(ReadTensorBytes(counting_, t), IsOkAndHolds(expected_[i]));
  }
  counting_.Reset();
  ASSERT_OK(group_->ReleaseAll(false));
  EXPECT_EQ(counting_.counts().free, 2);  // the pinned block, the device block
}

TEST_F(GroupCallsTest, OneDeviceAllocationPerReload) {
  ASSERT_NO_FATAL_FAILURE(PushAndOffload());
  counting_.Reset();
  ASSERT_OK(group_->StartReload());
  EXPECT_EQ(counting_.counts().allocate_device, 1);
  EXPECT_EQ(counting_.counts().record, 1 + kTensors);  // point, one per span
  std::vector<Tensor> popped;
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor t, group_->Pop(i));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage->data()) % 256, 0u);
    EXPECT_THAT(ReadTensorBytes(counting_, t), IsOkAndHolds(expected_[i]));
    popped.push_back(t);
  }
  // The caller keeps two popped tensors past the group's release: their
  // memory stays until they go, and no hazard.
  ASSERT_OK(group_->ReleaseAll(false));
  popped.erase(popped.begin() + 1, popped.begin() + 4);
  sim_.RunUntilIdle();
  EXPECT_GT(sim_.device_memory().live_bytes, 0);
  EXPECT_THAT(ReadTensorBytes(counting_, popped[1]),
              IsOkAndHolds(expected_[4]));
  popped.clear();
}

// A span whose size is not a multiple of 256 bytes ends its block (no
// padding: blocks hold exactly the spans' bytes, and spans start aligned).
TEST_F(GroupCallsTest, UnalignedSpanEndsItsBlock) {
  elements_ = {1024, 1000, 1024, 1024, 1001};  // blocks: [0 1] [2 3 4]
  ASSERT_NO_FATAL_FAILURE(PushAndOffload());
  EXPECT_EQ(counting_.counts().allocate_pinned, 2);
  int64_t bytes = 0;
  for (int i = 0; i < kTensors; ++i) bytes += 4 * elements_[i];
  EXPECT_EQ(group_->host_bytes(), bytes);
  counting_.Reset();
  ASSERT_OK(group_->StartReload());
  EXPECT_EQ(counting_.counts().allocate_device, 2);
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor t, group_->Pop(i));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage->data()) % 256, 0u);
    EXPECT_THAT(ReadTensorBytes(counting_, t), IsOkAndHolds(expected_[i]));
  }
  ASSERT_OK(group_->ReleaseAll(false));
}

TEST_F(GroupCallsTest, PopsInReverseOrderWaitOnce) {
  ASSERT_NO_FATAL_FAILURE(PushAndOffload());
  ASSERT_OK(group_->StartReload());
  counting_.Reset();
  std::vector<Tensor> popped(kTensors);
  for (int i = kTensors - 1; i >= 0; --i) {
    ASSERT_OK_AND_ASSIGN(popped[i], group_->Pop(i));
  }
  // The last span's reload event covers the earlier spans' copies (one H2D
  // stream, in span order): one wait, and nothing else.
  EXPECT_EQ(counting_.counts().wait, 1);
  EXPECT_EQ(counting_.counts().total(), 1);
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_THAT(ReadTensorBytes(counting_, popped[i]),
                IsOkAndHolds(expected_[i]));
  }
}

TEST_F(GroupCallsTest, PopsInPushOrderWaitEachForItsOwnSpan) {
  ASSERT_NO_FATAL_FAILURE(PushAndOffload());
  ASSERT_OK(group_->StartReload());
  counting_.Reset();
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor t, group_->Pop(i));
    ASSERT_OK_AND_ASSIGN(Tensor again, group_->Pop(i));  // no second wait
  }
  EXPECT_EQ(counting_.counts().wait, kTensors);
  ASSERT_OK(group_->ReleaseAll(false));
}

TEST_F(GroupCallsTest, RetainedPinnedBlockReusesItsEvent) {
  ASSERT_NO_FATAL_FAILURE(PushAndOffload(/*retain=*/true));
  ASSERT_OK(group_->StartReload());
  ASSERT_OK(group_->ReleaseAll(true));
  for (int iteration = 0; iteration < 3; ++iteration) {
    group_->BeginIteration();
    ASSERT_NO_FATAL_FAILURE(PushAndOffload(/*retain=*/true));
    ASSERT_OK(group_->StartReload());
    ASSERT_OK(group_->ReleaseAll(true));
    EXPECT_EQ(counting_.counts().new_event, 0);
    EXPECT_EQ(counting_.counts().allocate_pinned, 0);
  }
}

}  // namespace
}  // namespace offload
