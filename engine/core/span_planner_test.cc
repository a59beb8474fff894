#include "engine/core/span_planner.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/mock_backend.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::NiceMock;

// Storages need a Buffer; a mock backend hands out fake ones (never freed
// for real: the mock's Release returns OK and does nothing).
class GroupProcessorTest : public ::testing::Test {
 protected:
  std::shared_ptr<Storage> NewStorage(int64_t bytes) {
    void* fake = reinterpret_cast<void*>(next_address_);
    next_address_ += bytes + 4096;
    return std::make_shared<Storage>(backend_.MakeBufferForTest(
        fake, bytes, MemorySpace::kDevice, nullptr));
  }
  static Tensor View(std::shared_ptr<Storage> storage, DType dtype,
                     std::vector<int64_t> shape, std::vector<int64_t> strides,
                     int64_t offset) {
    Tensor t;
    t.storage = std::move(storage);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.strides = std::move(strides);
    t.offset = offset;
    return t;
  }
  static std::vector<const Tensor*> Ptrs(const std::vector<Tensor>& tensors) {
    std::vector<const Tensor*> out;
    for (const Tensor& t : tensors) out.push_back(&t);
    return out;
  }

  NiceMock<MockBackend> backend_;
  uintptr_t next_address_ = 0x100000;
};

TEST_F(GroupProcessorTest, SameTensorSavedThriceIsOneSpan) {
  auto storage = NewStorage(4096);
  Tensor x = View(storage, DType::kF32, {1024}, {1}, 0);
  std::vector<Tensor> tensors = {x, x, x};
  SpanPlan plan = PlanSpans(Ptrs(tensors), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].begin, 0);
  EXPECT_EQ(plan.spans[0].end, 4096);
  EXPECT_THAT(plan.spans[0].tensors, ElementsAre(0, 1, 2));
  EXPECT_THAT(plan.sparse, IsEmpty());
}

TEST_F(GroupProcessorTest, InterleavedQkvViewsShareOneSpanOfTheBase) {
  // qkv: [16 tokens, 3 * 64] bf16; q, k, v are column blocks of it.
  auto storage = NewStorage(16 * 192 * 2);
  std::vector<Tensor> views;
  for (int i = 0; i < 3; ++i) {
    views.push_back(View(storage, DType::kBF16, {16, 64}, {192, 1}, 64 * i));
  }
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].begin, 0);
  EXPECT_EQ(plan.spans[0].end, 16 * 192 * 2);
  EXPECT_THAT(plan.spans[0].tensors, ElementsAre(0, 1, 2));
}

TEST_F(GroupProcessorTest, EvenAndOddHalvesTogetherCoverTheirStorage) {
  auto storage = NewStorage(8192);
  std::vector<Tensor> halves = {View(storage, DType::kF32, {1024}, {2}, 0),
                                View(storage, DType::kF32, {1024}, {2}, 1)};
  SpanPlan plan = PlanSpans(Ptrs(halves), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].bytes(), 8192);
  // Alone, x[1::2] covers about half of the bytes it reaches.
  std::vector<Tensor> odd = {halves[1]};
  EXPECT_EQ(PlanSpans(Ptrs(odd), 0.5).spans.size(), 1u);
  EXPECT_EQ(PlanSpans(Ptrs(odd), 0.6).sparse.size(), 1u);
}

TEST_F(GroupProcessorTest, SparseViewIsReportedWithItsCoverage) {
  auto storage = NewStorage(8192 * 4);
  std::vector<Tensor> views = {View(storage, DType::kF32, {1024}, {8}, 0)};
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  EXPECT_THAT(plan.spans, IsEmpty());
  ASSERT_THAT(plan.sparse, ElementsAre(0));
  // 1024 elements over (1023 * 8 + 1) elements of extent.
  EXPECT_NEAR(plan.sparse_coverage[0], 1024.0 / 8185.0, 1e-12);
}

TEST_F(GroupProcessorTest, OffloadBaseTakesTheWholeStorage) {
  auto storage = NewStorage(8192 * 4);
  std::vector<Tensor> views = {View(storage, DType::kF32, {1024}, {8}, 3)};
  views[0].flags.offload_base = true;
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].begin, 0);
  EXPECT_EQ(plan.spans[0].end, 8192 * 4);
  EXPECT_THAT(plan.sparse, IsEmpty());
}

TEST_F(GroupProcessorTest, ContiguousSliceCopiesOnlyItsAlignedExtent) {
  auto storage = NewStorage(1 << 20);
  // Elements [1000, 3000) of a float storage: bytes [4000, 12000).
  std::vector<Tensor> views = {View(storage, DType::kF32, {2000}, {1}, 1000)};
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].begin, 3840);  // 4000 aligned down to 256
  EXPECT_EQ(plan.spans[0].end, 12000);
}

TEST_F(GroupProcessorTest, FarApartDenseViewsGetSpansOfTheirOwn) {
  auto storage = NewStorage(1 << 20);
  std::vector<Tensor> views = {
      View(storage, DType::kF32, {256}, {1}, (1 << 18) - 256),  // tail
      View(storage, DType::kF32, {64}, {1024}, 1024),           // sparse
      View(storage, DType::kF32, {256}, {1}, 0)};               // head
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 2u);  // by address within the storage
  EXPECT_EQ(plan.spans[0].begin, 0);
  EXPECT_EQ(plan.spans[0].end, 1024);
  EXPECT_THAT(plan.spans[0].tensors, ElementsAre(2));
  EXPECT_EQ(plan.spans[1].end, 1 << 20);
  EXPECT_THAT(plan.spans[1].tensors, ElementsAre(0));
  EXPECT_THAT(plan.sparse, ElementsAre(1));
}

TEST_F(GroupProcessorTest, OverlappingDenseViewsMergeIntoOneSpan) {
  auto storage = NewStorage(1 << 20);
  std::vector<Tensor> views = {View(storage, DType::kF32, {1000}, {1}, 0),
                               View(storage, DType::kF32, {1000}, {1}, 900),
                               View(storage, DType::kF32, {1000}, {1}, 200000)};
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_EQ(plan.spans[0].begin, 0);
  EXPECT_EQ(plan.spans[0].end, 1900 * 4);
  EXPECT_THAT(plan.spans[0].tensors, ElementsAre(0, 1));
  EXPECT_THAT(plan.spans[1].tensors, ElementsAre(2));
}

TEST_F(GroupProcessorTest, StoragesAreSpannedSeparatelyInOrderOfFirstUse) {
  auto first = NewStorage(4096);
  auto second = NewStorage(4096);
  Tensor x = View(second, DType::kF32, {1024}, {1}, 0);
  Tensor y = View(first, DType::kF32, {1024}, {1}, 0);
  Tensor empty = View(first, DType::kF32, {0, 4}, {4, 1}, 0);
  std::vector<Tensor> tensors = {x, y, x, empty};
  SpanPlan plan = PlanSpans(Ptrs(tensors), 0.5);
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_EQ(plan.spans[0].storage, second);
  EXPECT_THAT(plan.spans[0].tensors, ElementsAre(0, 2));
  EXPECT_EQ(plan.spans[1].storage, first);
  EXPECT_THAT(plan.spans[1].tensors, ElementsAre(1));
  EXPECT_THAT(plan.sparse, IsEmpty());
}

TEST_F(GroupProcessorTest, TransposedViewOfAStorageIsDense) {
  auto storage = NewStorage(64 * 32 * 2);
  std::vector<Tensor> views = {View(storage, DType::kBF16, {32, 64}, {1, 32}, 0)};
  SpanPlan plan = PlanSpans(Ptrs(views), 0.5);
  ASSERT_EQ(plan.spans.size(), 1u);
  EXPECT_EQ(plan.spans[0].bytes(), 64 * 32 * 2);
}

}  // namespace
}  // namespace offload
