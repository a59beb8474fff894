#include "engine/tensor.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

class TensorTest : public ::testing::Test {
 protected:
  // A storage of `bytes` bytes of simulated device memory.
  std::shared_ptr<Storage> NewStorage(int64_t bytes) {
    StatusOr<Buffer> buffer =
        sim_->AllocateDevice(bytes, sim_->ComputeStream());
    EXPECT_OK(buffer);
    return std::make_shared<Storage>(std::move(buffer).value());
  }

  // A contiguous tensor of `shape` on a storage that fits it exactly.
  Tensor NewTensor(DType dtype, std::vector<int64_t> shape,
                   std::string name = "x") {
    Tensor t;
    t.dtype = dtype;
    t.strides = ContiguousStrides(shape);
    t.shape = std::move(shape);
    t.name = std::move(name);
    t.storage = NewStorage(std::max<int64_t>(t.nbytes(), 1));
    return t;
  }

  // Declared first: storages (members of tests) must go before the backend.
  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
};

TEST(DTypeTest, SizesMatchTheElementWidths) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kFP8E4M3), 1);
  EXPECT_EQ(DTypeSize(DType::kFP8E5M2), 1);
  EXPECT_EQ(DTypeSize(DType::kU8), 1);
  EXPECT_EQ(DTypeSize(DType::kI32), 4);
  EXPECT_EQ(DTypeSize(DType::kI64), 8);
}

TEST(DTypeTest, NamesAreShortLowercaseSpellings) {
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kFP8E4M3), "fp8_e4m3");
  EXPECT_EQ(DTypeName(DType::kFP8E5M2), "fp8_e5m2");
  EXPECT_EQ(DTypeName(DType::kU8), "u8");
  EXPECT_EQ(DTypeName(DType::kI32), "i32");
  EXPECT_EQ(DTypeName(DType::kI64), "i64");
}

TEST(TensorShapeTest, NumelIsTheProductOfTheSizes) {
  Tensor t;
  t.shape = {2, 3, 4};
  EXPECT_EQ(t.numel(), 24);
  t.shape = {};  // a scalar
  EXPECT_EQ(t.numel(), 1);
  t.shape = {5, 0, 7};
  EXPECT_EQ(t.numel(), 0);
}

TEST(TensorShapeTest, NbytesIsNumelTimesElementSize) {
  Tensor t;
  t.dtype = DType::kBF16;
  t.shape = {3, 5};
  EXPECT_EQ(t.element_size(), 2);
  EXPECT_EQ(t.nbytes(), 30);
  t.dtype = DType::kI64;
  EXPECT_EQ(t.nbytes(), 120);
}

TEST(TensorShapeTest, ContiguousStridesAreRowMajor) {
  EXPECT_THAT(ContiguousStrides({2, 3, 4}), ElementsAre(12, 4, 1));
  EXPECT_THAT(ContiguousStrides({7}), ElementsAre(1));
  EXPECT_THAT(ContiguousStrides({}), ElementsAre());
}

TEST(TensorShapeTest, RowMajorTensorIsContiguous) {
  Tensor t;
  t.shape = {2, 3, 4};
  t.strides = {12, 4, 1};
  EXPECT_TRUE(t.IsContiguous());
  t.offset = 100;  // an offset does not break contiguity
  EXPECT_TRUE(t.IsContiguous());
}

TEST(TensorShapeTest, TransposeAndStridedSliceAreNotContiguous) {
  Tensor transposed;
  transposed.shape = {4, 3};
  transposed.strides = {1, 4};
  EXPECT_FALSE(transposed.IsContiguous());

  Tensor every_other_row;  // x[::2] of a [8, 4] tensor
  every_other_row.shape = {4, 4};
  every_other_row.strides = {8, 1};
  EXPECT_FALSE(every_other_row.IsContiguous());

  Tensor column;  // x[:, 1:2] of a [8, 4] tensor: shape [8, 1]
  column.shape = {8, 1};
  column.strides = {4, 1};
  EXPECT_FALSE(column.IsContiguous());
}

TEST(TensorShapeTest, StridesOfSizeOneDimensionsDoNotMatter) {
  Tensor t;
  t.shape = {1, 3, 1, 4};
  t.strides = {999, 4, 12345, 1};
  EXPECT_TRUE(t.IsContiguous());

  // A row of a matrix, kept 2-D: x[1:2] of a [8, 4] tensor.
  Tensor row;
  row.shape = {1, 4};
  row.strides = {4, 1};
  row.offset = 4;
  EXPECT_TRUE(row.IsContiguous());

  // The single size-1 dim does not make a strided inner dim contiguous.
  Tensor strided;
  strided.shape = {1, 4};
  strided.strides = {8, 2};
  EXPECT_FALSE(strided.IsContiguous());
}

TEST(TensorShapeTest, ScalarIsContiguous) {
  Tensor t;
  t.shape = {};
  t.strides = {};
  EXPECT_TRUE(t.IsContiguous());
}

TEST(ByteExtentTest, ContiguousTensorCoversItsBytes) {
  Tensor t;
  t.dtype = DType::kF32;
  t.shape = {2, 3};
  t.strides = {3, 1};
  EXPECT_THAT(t.ByteExtent(), Pair(0, 24));
  t.offset = 5;
  EXPECT_THAT(t.ByteExtent(), Pair(20, 44));
}

TEST(ByteExtentTest, SlicesCoverFromFirstToLastElement) {
  // x of shape [8, 4] bf16; x[::2] starts at element 0, x[1::2] at 4.
  Tensor even;
  even.dtype = DType::kBF16;
  even.shape = {4, 4};
  even.strides = {8, 1};
  EXPECT_THAT(even.ByteExtent(), Pair(0, (24 + 3 + 1) * 2));

  Tensor odd = even;
  odd.offset = 4;
  EXPECT_THAT(odd.ByteExtent(), Pair(8, (4 + 24 + 3 + 1) * 2));

  // A column x[:, 2] (shape [8], stride 4).
  Tensor column;
  column.dtype = DType::kBF16;
  column.shape = {8};
  column.strides = {4};
  column.offset = 2;
  EXPECT_THAT(column.ByteExtent(), Pair(4, (2 + 28 + 1) * 2));
}

TEST(ByteExtentTest, TransposeCoversTheSameBytesAsItsBase) {
  Tensor base;
  base.dtype = DType::kI32;
  base.shape = {3, 5};
  base.strides = {5, 1};
  Tensor transposed = base;
  transposed.shape = {5, 3};
  transposed.strides = {1, 5};
  EXPECT_EQ(transposed.ByteExtent(), base.ByteExtent());
  EXPECT_THAT(transposed.ByteExtent(), Pair(0, 60));
}

TEST(ByteExtentTest, EmptyTensorHasEmptyExtentAtItsOffset) {
  Tensor t;
  t.dtype = DType::kF16;
  t.shape = {4, 0};
  t.strides = {1, 1};
  t.offset = 10;
  auto [begin, end] = t.ByteExtent();
  EXPECT_EQ(begin, end);
  EXPECT_EQ(begin, 20);
}

TEST(ByteExtentTest, ScalarCoversOneElement) {
  Tensor t;
  t.dtype = DType::kI64;
  t.offset = 3;
  EXPECT_THAT(t.ByteExtent(), Pair(24, 32));
}

TEST(DescribeTest, NamesDtypeShapeStridesAndOffset) {
  Tensor t;
  t.name = "qkv";
  t.dtype = DType::kBF16;
  t.shape = {4, 8};
  t.strides = {8, 1};
  EXPECT_EQ(t.Describe(), "'qkv' (bf16 [4, 8] strides [8, 1] offset 0)");
}

TEST_F(TensorTest, WellFormedTensorsValidate) {
  Tensor t = NewTensor(DType::kF32, {4, 8});
  EXPECT_OK(ValidateTensor(t));

  Tensor slice = t;  // t[1::2]: the last element is the storage's last
  slice.shape = {2, 8};
  slice.strides = {16, 1};
  slice.offset = 8;
  EXPECT_OK(ValidateTensor(slice));

  Tensor empty = t;  // an empty view may sit at the storage's end
  empty.shape = {0, 8};
  empty.offset = 32;
  EXPECT_OK(ValidateTensor(empty));
}

TEST_F(TensorTest, ValidateRejectsMissingStorage) {
  Tensor t;
  t.name = "orphan";
  t.shape = {4};
  t.strides = {1};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("orphan"), HasSubstr("storage"))));
}

TEST_F(TensorTest, ValidateRejectsOutOfBoundsView) {
  Tensor t = NewTensor(DType::kF32, {4, 8}, "act");
  Tensor past_end = t;
  past_end.offset = 1;  // the last element lands one past the storage
  EXPECT_THAT(ValidateTensor(past_end),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("act"), HasSubstr("132"),
                             HasSubstr("128"))));

  Tensor too_big = t;
  too_big.shape = {5, 8};
  EXPECT_THAT(ValidateTensor(too_big),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("act")));

  Tensor wide_stride = t;  // same numel, strides reach past the end
  wide_stride.strides = {16, 1};
  EXPECT_THAT(ValidateTensor(wide_stride),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("act")));
}

TEST_F(TensorTest, ValidateRejectsNegativeStride) {
  Tensor t = NewTensor(DType::kBF16, {4, 8}, "flipped");
  t.strides = {-8, 1};
  t.offset = 24;
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("flipped"), HasSubstr("stride"))));
}

TEST_F(TensorTest, ValidateRejectsMismatchedShapeAndStrides) {
  Tensor t = NewTensor(DType::kBF16, {4, 8}, "ragged");
  t.strides = {1};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("ragged"), HasSubstr("length"))));
}

TEST_F(TensorTest, ValidateRejectsNegativeSizeAndOffset) {
  Tensor t = NewTensor(DType::kU8, {16}, "weird");
  Tensor negative_size = t;
  negative_size.shape = {-1};
  EXPECT_THAT(ValidateTensor(negative_size),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("weird"), HasSubstr("size"))));
  Tensor negative_offset = t;
  negative_offset.shape = {4};
  negative_offset.offset = -2;
  EXPECT_THAT(ValidateTensor(negative_offset),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("weird"), HasSubstr("offset"))));
}

// Hostile geometry (issue 9). Before overflow checks, each of these wrapped
// around to a small extent that fit its storage and validated.
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST_F(TensorTest, ValidateRejectsElementCountWhoseBytesOverflow) {
  // [2^62 + 1] f32 with stride 4: numel fits, bytes and extent do not (they
  // wrapped to 4 and offloaded a 4-byte span).
  Tensor t = NewTensor(DType::kF32, {1}, "huge");
  t.shape = {(int64_t{1} << 62) + 1};
  t.strides = {4};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("huge"), HasSubstr("size overflows"))));
}

TEST_F(TensorTest, ValidateRejectsBroadcastViewWhoseElementCountOverflows) {
  // [2^32, 2^32] strides [0, 0]: the extent is one element, numel is 2^64.
  Tensor t = NewTensor(DType::kF32, {1}, "broadcast");
  t.shape = {int64_t{1} << 32, int64_t{1} << 32};
  t.strides = {0, 0};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("broadcast"),
                             HasSubstr("size overflows"))));

  // The overflow can come at a later dimension.
  Tensor later = NewTensor(DType::kI64, {1}, "later");
  later.shape = {1, int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 30};
  later.strides = {0, 0, 0, 0};
  EXPECT_THAT(ValidateTensor(later),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("later"), HasSubstr("size overflows"))));
}

TEST_F(TensorTest, ValidateRejectsBroadcastViewWhoseBytesOverflow) {
  // numel 2^62 fits in int64_t; times 4 bytes it does not.
  Tensor t = NewTensor(DType::kF32, {1}, "wide");
  t.shape = {int64_t{1} << 31, int64_t{1} << 31};
  t.strides = {0, 0};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("wide"), HasSubstr("size overflows"))));
}

TEST_F(TensorTest, ValidateRejectsOffsetWhoseBytesOverflow) {
  Tensor t = NewTensor(DType::kF32, {1}, "far");
  t.offset = kMax / 2;
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("far"), HasSubstr("size overflows"))));
  Tensor empty = t;  // even with no elements, the offset is out of range
  empty.shape = {0};
  EXPECT_THAT(ValidateTensor(empty),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("far"), HasSubstr("size overflows"))));
}

TEST_F(TensorTest, ValidateRejectsStridesWhoseExtentOverflows) {
  // numel and nbytes are small; the last element's index is not.
  Tensor t = NewTensor(DType::kU8, {1}, "spread");
  t.shape = {3, 2};
  t.strides = {kMax / 2, 1};
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("spread"),
                             HasSubstr("size overflows"))));
}

TEST_F(TensorTest, EmptyViewWithHugeSizesIsNotAnOverflow) {
  // A size of 0 makes the element count 0 whatever the other sizes are.
  Tensor t = NewTensor(DType::kF32, {1}, "nothing");
  t.shape = {int64_t{1} << 62, int64_t{1} << 62, 0};
  t.strides = {0, 0, 1};
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0);
  EXPECT_THAT(t.ByteExtent(), Pair(0, 0));
  EXPECT_OK(ValidateTensor(t));
}

TEST(TensorOverflowTest, GeometryOfOverflowingTensorsSaturates) {
  Tensor t;
  t.dtype = DType::kF32;
  t.shape = {int64_t{1} << 32, int64_t{1} << 32};
  t.strides = {0, 0};
  EXPECT_EQ(t.numel(), kMax);
  EXPECT_EQ(t.nbytes(), kMax);
  EXPECT_THAT(t.ByteExtent(), Pair(0, 4));  // the extent itself fits

  t.shape = {int64_t{1} << 31, int64_t{1} << 31};
  EXPECT_EQ(t.numel(), int64_t{1} << 62);
  EXPECT_EQ(t.nbytes(), kMax);

  t.shape = {(int64_t{1} << 62) + 1};
  t.strides = {4};
  EXPECT_EQ(t.nbytes(), kMax);
  EXPECT_THAT(t.ByteExtent(), Pair(0, kMax));

  t.shape = {1};
  t.strides = {1};
  t.offset = kMax / 2;
  EXPECT_THAT(t.ByteExtent(), Pair(kMax, kMax));
}

TEST(TensorOverflowTest, ContiguousStridesSaturate) {
  EXPECT_THAT(ContiguousStrides({0, int64_t{1} << 62, int64_t{1} << 62}),
              ElementsAre(kMax, int64_t{1} << 62, 1));
  EXPECT_THAT(ContiguousStrides({2, kMax, 2}), ElementsAre(kMax, 2, 1));
  // Saturated strides are still the tensor's contiguous strides.
  Tensor t;
  t.shape = {0, int64_t{1} << 62, int64_t{1} << 62};
  t.strides = ContiguousStrides(t.shape);
  EXPECT_TRUE(t.IsContiguous());
}

TEST(TensorOverflowTest, MalformedGeometryIsDefined) {
  // Negative sizes: the product saturates instead of overflowing.
  Tensor t;
  t.dtype = DType::kI64;
  t.shape = {kMin, -1};
  t.strides = {1, 1};
  EXPECT_EQ(t.numel(), kMax);
  EXPECT_EQ(t.nbytes(), kMax);
  t.shape = {kMin, 2};
  EXPECT_EQ(t.numel(), kMin);
  EXPECT_EQ(t.nbytes(), kMin);
  t.ByteExtent();  // defined, if meaningless
  t.IsContiguous();
  ContiguousStrides(t.shape);

  // Strides shorter than the shape are never read past their end.
  Tensor ragged;
  ragged.dtype = DType::kF32;
  ragged.shape = {4, 4};
  ragged.strides = {};
  EXPECT_THAT(ragged.ByteExtent(), Pair(0, kMax));
  EXPECT_FALSE(ragged.IsContiguous());
}

TEST(DTypeTest, ValuesOutsideTheEnumAreNamedUnknown) {
  EXPECT_EQ(DTypeSize(static_cast<DType>(77)), 1);
  EXPECT_EQ(DTypeName(static_cast<DType>(77)), "unknown");
  EXPECT_EQ(DTypeSize(static_cast<DType>(-1)), 1);
  EXPECT_EQ(DTypeName(static_cast<DType>(-1)), "unknown");
}

TEST_F(TensorTest, ValidateRejectsDTypeOutsideTheEnum) {
  Tensor t = NewTensor(DType::kF32, {4}, "alien");
  t.dtype = static_cast<DType>(77);
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("alien"), HasSubstr("dtype"),
                             HasSubstr("77"))));
}

// Memory that claims a size but has no address, as a broken binding might.
class NullMemory final : public StorageMemory {
 public:
  void* data() const override { return nullptr; }
  int64_t size_bytes() const override { return 64; }
  MemorySpace space() const override { return MemorySpace::kDevice; }
  const Backend* backend() const override { return nullptr; }
  Status ReleaseAfter(Stream&) override { return OkStatus(); }
};

TEST_F(TensorTest, ValidateRejectsNullMemory) {
  Tensor t;
  t.name = "ghost";
  t.shape = {16};
  t.strides = {1};
  t.storage = std::make_shared<Storage>(std::make_unique<NullMemory>());
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("ghost"), HasSubstr("null"))));
  Tensor empty = t;  // a view of no bytes touches no memory
  empty.shape = {0};
  EXPECT_OK(ValidateTensor(empty));
}

TEST_F(TensorTest, ValidateRejectsReleasedStorage) {
  Tensor t = NewTensor(DType::kF32, {16}, "freed");
  ASSERT_OK(t.storage->memory().ReleaseAfter(sim_->ComputeStream()));
  ASSERT_EQ(t.storage->data(), nullptr);
  EXPECT_THAT(ValidateTensor(t),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("freed"), HasSubstr("released"))));
}

TEST_F(TensorTest, CopiesOfATensorShareStorageAndReadyEvent) {
  Tensor t = NewTensor(DType::kF32, {16});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, sim_->NewEvent());
  t.ready = std::move(event);
  Tensor copy = t;
  EXPECT_EQ(copy.storage.get(), t.storage.get());
  EXPECT_EQ(copy.ready.get(), t.ready.get());
  EXPECT_EQ(t.storage.use_count(), 2);
}

TEST_F(TensorTest, StorageReportsItsBuffer) {
  std::shared_ptr<Storage> storage = NewStorage(4096);
  EXPECT_EQ(storage->size_bytes(), 4096);
  EXPECT_EQ(storage->space(), MemorySpace::kDevice);
  EXPECT_EQ(storage->data(), storage->buffer()->data());
  EXPECT_NE(storage->data(), nullptr);
}

TEST(MarkNotOffloadTest, SetsOnlyTheDoNotOffloadFlag) {
  Tensor t;
  t.flags.weight = true;
  MarkNotOffload(t);
  EXPECT_TRUE(t.flags.do_not_offload);
  EXPECT_TRUE(t.flags.weight);
  EXPECT_FALSE(t.flags.parameter);
  EXPECT_FALSE(t.flags.offload_base);
  MarkNotOffload(t);  // idempotent
  EXPECT_TRUE(t.flags.do_not_offload);
}

TEST(MarkNotOffloadTest, FlagsDefaultToOffloadable) {
  Tensor t;
  EXPECT_FALSE(t.flags.parameter);
  EXPECT_FALSE(t.flags.weight);
  EXPECT_FALSE(t.flags.do_not_offload);
  EXPECT_FALSE(t.flags.offload_base);
  EXPECT_EQ(t.ready, nullptr);
}

}  // namespace
}  // namespace offload
