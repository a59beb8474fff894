#include "workload/tensor_util.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class TensorUtilTest : public ::testing::Test {
 protected:
  void SetUp() override { sim_ = NewSimBackend(SimOptions{}); }
  // Every test ends with the device idle and no stream-ordering bug.
  void TearDown() override {
    sim_->RunUntilIdle();
    for (const Hazard& hazard : sim_->hazards()) {
      ADD_FAILURE() << hazard.ToString();
    }
  }

  std::unique_ptr<SimBackend> sim_;
};

// An oracle independent of strides: element i of a view, as a multi-index,
// maps to a multi-index of the base array, composed operation by operation.
struct IndexView {
  std::vector<int64_t> shape;
  std::function<std::vector<int64_t>(const std::vector<int64_t>&)> to_base;
};

IndexView Identity(std::vector<int64_t> shape) {
  return {shape, [](const std::vector<int64_t>& i) { return i; }};
}

IndexView SliceOf(const IndexView& v, int dim, int64_t start, int64_t stop,
                  int64_t step) {
  IndexView out = v;
  out.shape[dim] = (stop - start + step - 1) / step;
  out.to_base = [f = v.to_base, dim, start, step](std::vector<int64_t> i) {
    i[dim] = start + i[dim] * step;
    return f(i);
  };
  return out;
}

IndexView TransposeOf(const IndexView& v, int a, int b) {
  IndexView out = v;
  std::swap(out.shape[a], out.shape[b]);
  out.to_base = [f = v.to_base, a, b](std::vector<int64_t> i) {
    std::swap(i[a], i[b]);
    return f(i);
  };
  return out;
}

IndexView SelectOf(const IndexView& v, int dim, int64_t index) {
  IndexView out = v;
  out.shape.erase(out.shape.begin() + dim);
  out.to_base = [f = v.to_base, dim, index](std::vector<int64_t> i) {
    i.insert(i.begin() + dim, index);
    return f(i);
  };
  return out;
}

// The expected logical bytes of `view` over a contiguous base of
// `base_shape` whose bytes are `base_bytes`, element size `element`.
std::vector<uint8_t> Expected(const IndexView& view,
                              const std::vector<int64_t>& base_shape,
                              const std::vector<uint8_t>& base_bytes,
                              int64_t element) {
  std::vector<uint8_t> out;
  int64_t numel = 1;
  for (int64_t s : view.shape) numel *= s;
  std::vector<int64_t> index(view.shape.size(), 0);
  for (int64_t n = 0; n < numel; ++n) {
    std::vector<int64_t> base = view.to_base(index);
    int64_t linear = 0;
    for (size_t d = 0; d < base_shape.size(); ++d) {
      linear = linear * base_shape[d] + base[d];
    }
    for (int64_t b = 0; b < element; ++b) {
      out.push_back(base_bytes[linear * element + b]);
    }
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

TEST_F(TensorUtilTest, MakeDeviceTensorIsContiguousAndNamed) {
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       MakeDeviceTensor(*sim_, DType::kBF16, {3, 5, 7}, 42));
  EXPECT_EQ(t.dtype, DType::kBF16);
  EXPECT_THAT(t.shape, ElementsAre(3, 5, 7));
  EXPECT_THAT(t.strides, ElementsAre(35, 7, 1));
  EXPECT_EQ(t.offset, 0);
  EXPECT_TRUE(t.IsContiguous());
  EXPECT_EQ(t.name, "pattern42");
  EXPECT_EQ(t.storage->space(), MemorySpace::kDevice);
  EXPECT_EQ(t.storage->size_bytes(), 3 * 5 * 7 * 2);
  EXPECT_EQ(t.storage->buffer()->stream(), &sim_->ComputeStream());
  EXPECT_OK(ValidateTensor(t));
}

TEST_F(TensorUtilTest, BytesAreDeterministicPerSeedAndDifferAcrossSeeds) {
  ASSERT_OK_AND_ASSIGN(Tensor a, MakeDeviceTensor(*sim_, DType::kF32,
                                                  {64, 33}, 1));
  ASSERT_OK_AND_ASSIGN(Tensor b, MakeDeviceTensor(*sim_, DType::kF32,
                                                  {64, 33}, 1));
  ASSERT_OK_AND_ASSIGN(Tensor c, MakeDeviceTensor(*sim_, DType::kF32,
                                                  {64, 33}, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes_a, ReadTensorBytes(*sim_, a));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes_b, ReadTensorBytes(*sim_, b));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes_c, ReadTensorBytes(*sim_, c));
  EXPECT_TRUE(BytesEqual(bytes_a, PatternBytes(0, 64 * 33 * 4, 1)));
  EXPECT_EQ(bytes_a, bytes_b);
  int same = 0;
  for (size_t i = 0; i < bytes_a.size(); ++i) same += bytes_a[i] == bytes_c[i];
  EXPECT_LT(same, static_cast<int>(bytes_a.size()) / 32);
  EXPECT_EQ(PatternTensorBytes(a, 1), bytes_a);
}

TEST_F(TensorUtilTest, StagingIsFreedOrderedAfterTheCopy) {
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       MakeDeviceTensor(*sim_, DType::kU8, {1 << 20}, 3));
  // Before the device ran, the staging buffer is still live; once the compute
  // stream has passed the copy and the free, no pinned byte is held.
  EXPECT_OK(sim_->ComputeStream().Synchronize());
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().peak_bytes, 1 << 20);
  EXPECT_EQ(sim_->device_memory().live_bytes, 1 << 20);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
  t = Tensor();
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

TEST_F(TensorUtilTest, EmptyAndScalarTensors) {
  ASSERT_OK_AND_ASSIGN(Tensor empty,
                       MakeDeviceTensor(*sim_, DType::kI64, {4, 0, 3}, 5));
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_OK(ValidateTensor(empty));
  EXPECT_THAT(ReadTensorBytes(*sim_, empty), IsOkAndHolds(IsEmpty()));
  ASSERT_OK_AND_ASSIGN(Tensor scalar,
                       MakeDeviceTensor(*sim_, DType::kI64, {}, 5));
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_THAT(ReadTensorBytes(*sim_, scalar),
              IsOkAndHolds(PatternBytes(0, 8, 5)));
}

TEST_F(TensorUtilTest, SlicesMatchTheHostGather) {
  const std::vector<int64_t> shape = {6, 10, 4};
  ASSERT_OK_AND_ASSIGN(Tensor base,
                       MakeDeviceTensor(*sim_, DType::kF16, shape, 9));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> full, ReadTensorBytes(*sim_, base));
  struct Case {
    int dim;
    int64_t start, stop, step;
  };
  for (const Case& c : {Case{0, 1, 5, 1}, Case{1, 2, 9, 3}, Case{2, 0, 4, 2},
                        Case{1, 0, 10, 1}, Case{0, 5, 6, 7}}) {
    SCOPED_TRACE(testing::Message() << "dim " << c.dim << " [" << c.start
                                    << ":" << c.stop << ":" << c.step << "]");
    ASSERT_OK_AND_ASSIGN(Tensor view,
                         Slice(base, c.dim, c.start, c.stop, c.step));
    EXPECT_EQ(view.storage, base.storage);
    EXPECT_THAT(view.name, HasSubstr("pattern9.slice("));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, ReadTensorBytes(*sim_, view));
    EXPECT_TRUE(BytesEqual(
        got, Expected(SliceOf(Identity(shape), c.dim, c.start, c.stop, c.step),
                      shape, full, 2)));
    EXPECT_EQ(PatternTensorBytes(view, 9), got);
  }
}

TEST_F(TensorUtilTest, InterleavedQkvViewsOfOneBuffer) {
  // A fused qkv projection output [S, B, 3 * H] and its q, k, v views.
  const std::vector<int64_t> shape = {8, 2, 3 * 16};
  ASSERT_OK_AND_ASSIGN(Tensor qkv,
                       MakeDeviceTensor(*sim_, DType::kBF16, shape, 11));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> full, ReadTensorBytes(*sim_, qkv));
  for (int64_t part = 0; part < 3; ++part) {
    ASSERT_OK_AND_ASSIGN(Tensor v, Slice(qkv, 2, part * 16, (part + 1) * 16));
    EXPECT_FALSE(v.IsContiguous());
    EXPECT_EQ(v.offset, part * 16);
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, ReadTensorBytes(*sim_, v));
    EXPECT_TRUE(BytesEqual(
        got, Expected(SliceOf(Identity(shape), 2, part * 16, (part + 1) * 16, 1),
                      shape, full, 2)));
  }
}

TEST_F(TensorUtilTest, TransposeSelectPermuteAndReshape) {
  const std::vector<int64_t> shape = {3, 4, 5};
  ASSERT_OK_AND_ASSIGN(Tensor base,
                       MakeDeviceTensor(*sim_, DType::kI32, shape, 13));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> full, ReadTensorBytes(*sim_, base));

  ASSERT_OK_AND_ASSIGN(Tensor t, Transpose(base, 0, 2));
  EXPECT_THAT(t.shape, ElementsAre(5, 4, 3));
  EXPECT_THAT(t.strides, ElementsAre(1, 5, 20));
  EXPECT_THAT(ReadTensorBytes(*sim_, t),
              IsOkAndHolds(Expected(TransposeOf(Identity(shape), 0, 2), shape,
                                    full, 4)));

  ASSERT_OK_AND_ASSIGN(Tensor s, Select(base, 1, 2));
  EXPECT_THAT(s.shape, ElementsAre(3, 5));
  EXPECT_THAT(ReadTensorBytes(*sim_, s),
              IsOkAndHolds(
                  Expected(SelectOf(Identity(shape), 1, 2), shape, full, 4)));

  // permute(2, 0, 1) == transpose(0, 2) then transpose(1, 2).
  ASSERT_OK_AND_ASSIGN(Tensor p, Permute(base, {2, 0, 1}));
  EXPECT_THAT(p.shape, ElementsAre(5, 3, 4));
  EXPECT_THAT(
      ReadTensorBytes(*sim_, p),
      IsOkAndHolds(Expected(
          TransposeOf(TransposeOf(Identity(shape), 0, 2), 1, 2), shape, full,
          4)));

  // A reshape of a contiguous tensor keeps the bytes in order.
  ASSERT_OK_AND_ASSIGN(Tensor r, Reshape(base, {12, 5}));
  EXPECT_THAT(r.strides, ElementsAre(5, 1));
  EXPECT_THAT(ReadTensorBytes(*sim_, r), IsOkAndHolds(full));
  // A contiguous view at an offset (one row) reshapes too.
  ASSERT_OK_AND_ASSIGN(Tensor row, Select(base, 0, 1));
  ASSERT_OK_AND_ASSIGN(Tensor flat, Reshape(row, {20}));
  EXPECT_EQ(flat.offset, 20);
  EXPECT_THAT(ReadTensorBytes(*sim_, flat),
              IsOkAndHolds(std::vector<uint8_t>(full.begin() + 80,
                                                full.begin() + 160)));
}

TEST_F(TensorUtilTest, RandomViewChainsMatchTheOracle) {
  std::mt19937_64 rng(2024);
  auto pick = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int round = 0; round < 40; ++round) {
    std::vector<int64_t> shape;
    for (int64_t d = pick(1, 4); d > 0; --d) shape.push_back(pick(1, 7));
    const DType dtype = round % 2 ? DType::kF32 : DType::kU8;
    ASSERT_OK_AND_ASSIGN(Tensor view,
                         MakeDeviceTensor(*sim_, dtype, shape, round));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> full,
                         ReadTensorBytes(*sim_, view));
    IndexView oracle = Identity(shape);
    for (int step = 0; step < 4 && !view.shape.empty(); ++step) {
      const int dim = static_cast<int>(pick(0, view.shape.size() - 1));
      switch (pick(0, 2)) {
        case 0: {
          const int64_t size = view.shape[dim];
          const int64_t start = pick(0, size - 1);
          const int64_t stop = pick(start + 1, size);
          const int64_t stride = pick(1, 3);
          ASSERT_OK_AND_ASSIGN(view, Slice(view, dim, start, stop, stride));
          oracle = SliceOf(oracle, dim, start, stop, stride);
          break;
        }
        case 1: {
          const int other = static_cast<int>(pick(0, view.shape.size() - 1));
          ASSERT_OK_AND_ASSIGN(view, Transpose(view, dim, other));
          oracle = TransposeOf(oracle, dim, other);
          break;
        }
        default: {
          const int64_t index = pick(0, view.shape[dim] - 1);
          ASSERT_OK_AND_ASSIGN(view, Select(view, dim, index));
          oracle = SelectOf(oracle, dim, index);
        }
      }
    }
    SCOPED_TRACE(view.Describe());
    ASSERT_OK(ValidateTensor(view));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, ReadTensorBytes(*sim_, view));
    EXPECT_TRUE(BytesEqual(got, Expected(oracle, shape, full,
                                         DTypeSize(dtype))));
    EXPECT_EQ(PatternTensorBytes(view, round), got);
  }
}

TEST_F(TensorUtilTest, AttentionOutputHasAStridedBase) {
  ASSERT_OK_AND_ASSIGN(
      StridedBaseViews views,
      MakeAttentionOutput(*sim_, DType::kBF16, /*batch=*/2, /*seq=*/6,
                          /*heads=*/3, /*head_dim=*/4, 17));
  EXPECT_EQ(views.base.storage, views.view.storage);
  EXPECT_EQ(views.base.storage, views.storage_view.storage);
  EXPECT_THAT(views.base.shape, ElementsAre(2, 3, 6, 4));
  EXPECT_FALSE(views.base.IsContiguous());
  EXPECT_THAT(views.view.shape, ElementsAre(2, 6, 12));
  EXPECT_TRUE(views.view.IsContiguous());
  // The contiguous view covers the whole storage in storage order; the base
  // reads it with heads and sequence swapped.
  const std::vector<int64_t> layout = {2, 6, 3, 4};
  std::vector<uint8_t> storage = PatternBytes(0, 2 * 6 * 3 * 4 * 2, 17);
  EXPECT_THAT(ReadTensorBytes(*sim_, views.view), IsOkAndHolds(storage));
  EXPECT_THAT(ReadTensorBytes(*sim_, views.base),
              IsOkAndHolds(Expected(TransposeOf(Identity(layout), 1, 2),
                                    layout, storage, 2)));
}

TEST_F(TensorUtilTest, ReadsPinnedTensorsDirectly) {
  ASSERT_OK_AND_ASSIGN(Buffer pinned, sim_->AllocatePinned(64));
  FillPattern(pinned.data(), 64, 21);
  Tensor t;
  t.storage = std::make_shared<Storage>(std::move(pinned));
  t.dtype = DType::kU8;
  t.shape = {4, 4};
  t.strides = {16, 2};
  t.offset = 1;
  IndexView oracle = SliceOf(Identity({4, 16}), 1, 1, 8, 2);
  EXPECT_THAT(ReadTensorBytes(*sim_, t),
              IsOkAndHolds(Expected(oracle, {4, 16}, PatternBytes(0, 64, 21),
                                    1)));
}

TEST_F(TensorUtilTest, ReadWaitsForTheReadyEvent) {
  // Bytes written by a copy on another stream become visible to the read
  // only because the read waits for the tensor's ready event: without that
  // wait the simulator would report a read-before-write hazard.
  ASSERT_OK_AND_ASSIGN(Stream * side, sim_->NewStream("side"));
  ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(*sim_, DType::kU8, {256}, 1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> allocated, sim_->NewEvent());
  ASSERT_OK(sim_->ComputeStream().Record(*allocated));
  ASSERT_OK(side->Wait(*allocated));
  ASSERT_OK_AND_ASSIGN(Buffer source, sim_->AllocatePinned(256));
  FillPattern(source.data(), 256, 99);
  ASSERT_OK(side->Copy(t.storage->data(), source.data(), 256));
  t.ready = std::shared_ptr<Event>(sim_->NewEvent().value().release());
  ASSERT_OK(side->Record(*t.ready));
  EXPECT_THAT(ReadTensorBytes(*sim_, t), IsOkAndHolds(PatternBytes(0, 256, 99)));
  ASSERT_OK(side->Synchronize());
}

TEST_F(TensorUtilTest, BadArgumentsAreInvalid) {
  EXPECT_THAT(MakeDeviceTensor(*sim_, DType::kF32, {4, -1}, 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(
      MakeDeviceTensor(*sim_, DType::kF32, {int64_t{1} << 40, 1 << 30}, 0),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("overflow")));
  ASSERT_OK_AND_ASSIGN(Tensor t, MakeDeviceTensor(*sim_, DType::kF32, {4, 6}, 0));
  EXPECT_THAT(Slice(t, 2, 0, 1), StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("dimension 2")));
  EXPECT_THAT(Slice(t, -1, 0, 1), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Slice(t, 1, 0, 7), StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("pattern0")));
  EXPECT_THAT(Slice(t, 1, 3, 2), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Slice(t, 1, 0, 6, 0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Select(t, 0, 4), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Select(t, 0, -1), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Transpose(t, 0, 2), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Permute(t, {0, 0}), StatusIs(StatusCode::kInvalidArgument,
                                           HasSubstr("permutation")));
  EXPECT_THAT(Permute(t, {1}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Reshape(t, {5, 5}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Reshape(t, {-4, -6}), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(Tensor tt, Transpose(t, 0, 1));
  EXPECT_THAT(Reshape(tt, {24}), StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("not contiguous")));
  EXPECT_THAT(MakeAttentionOutput(*sim_, DType::kF32, 1, 0, 1, 1, 0),
              StatusIs(StatusCode::kInvalidArgument));

  Tensor no_storage;
  no_storage.shape = {2};
  no_storage.strides = {1};
  EXPECT_THAT(ReadTensorBytes(*sim_, no_storage),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Slice(no_storage, 0, 0, 1),
              StatusIs(StatusCode::kInvalidArgument));
  Tensor outside = t;
  outside.offset = 1;  // the last element now lies past the storage
  EXPECT_THAT(ReadTensorBytes(*sim_, outside),
              StatusIs(StatusCode::kInvalidArgument));
  std::vector<uint8_t> few(8);
  EXPECT_THAT(GatherViewBytes(few, 0, t),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("only [0, 8)")));
  // The host-side pattern needs only the geometry, and rejects a bad one.
  EXPECT_EQ(PatternTensorBytes(no_storage, 0), PatternBytes(0, 8, 0));
  Tensor bad_geometry = no_storage;
  bad_geometry.strides = {-1};
  EXPECT_THAT(PatternTensorBytes(bad_geometry, 0), IsEmpty());
  EXPECT_THAT(GatherViewBytes(few, 0, bad_geometry),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("stride")));
}

TEST_F(TensorUtilTest, OutOfDeviceMemoryLeavesNothingBehind) {
  SimOptions options;
  options.device_capacity_bytes = 1 << 20;
  sim_ = NewSimBackend(options);
  EXPECT_THAT(MakeDeviceTensor(*sim_, DType::kU8, {2 << 20}, 0),
              StatusIs(StatusCode::kResourceExhausted));
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
  EXPECT_OK(MakeDeviceTensor(*sim_, DType::kU8, {1 << 20}, 0));
}

}  // namespace
}  // namespace offload
