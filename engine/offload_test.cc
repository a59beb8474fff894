// Behaviour of the layer-mode Offloader (SPEC §1–§4, §6) on the simulated
// GPU: round trips, memory, deduplication, views, composites, pass-through,
// scheduling and overlap. Error paths and faults: offload_errors_test.cc.
//
// Every test ends by checking that the simulator's hazard detector found
// nothing (SimOffloadTest::TearDown), after the test's tensors and its
// Offloader were destroyed.

#include "engine/offload.h"

#include <cstdint>
#include <memory>
#include <random>
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
#include "workload/tensor_util.h"

namespace offload {
namespace offload_test {
namespace {

using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// ------------------------------------------------------------ round trips

// The upstream suite's main test: random numbers of tensors per layer, of
// random dtypes and shapes, plain, transposed, saved twice, or split in two
// row slices, with n-1 of n layers offloaded, over several iterations.
TEST_F(OffloaderTest, RandomTensorsPerLayerRoundTripBitExactlyOverIterations) {
  constexpr int kLayers = 5;
  OffloadOptions options = DefaultOptions(kLayers, kLayers - 1);
  options.min_offload_elements = 1024;  // most random tensors qualify
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  const DType kDTypes[] = {DType::kF32,     DType::kBF16, DType::kF16,
                           DType::kFP8E4M3, DType::kU8,   DType::kI32,
                           DType::kI64};
  std::mt19937_64 rng(20240611);
  for (int iteration = 0; iteration < 4; ++iteration) {
    std::vector<std::vector<Pushed>> saved(kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
      const int count = static_cast<int>(rng() % 6);  // 0..5, empty layers too
      for (int i = 0; i < count; ++i) {
        const uint64_t seed = 1000 * iteration + 10 * layer + i + 1;
        const DType dtype = kDTypes[rng() % 7];
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 256);
        const int64_t cols = 1 + static_cast<int64_t>(rng() % 256);
        ASSERT_OK_AND_ASSIGN(Tensor t,
                             MakeDeviceTensor(*sim_, dtype, {rows, cols}, seed));
        std::vector<Tensor> views;
        switch (rng() % 4) {
          case 0:
            views = {t};
            break;
          case 1: {
            ASSERT_OK_AND_ASSIGN(Tensor transposed, Transpose(t, 0, 1));
            views = {transposed};
            break;
          }
          case 2:
            views = {t, t};  // the same tensor saved twice
            break;
          default: {
            ASSERT_OK_AND_ASSIGN(Tensor top, Slice(t, 0, 0, rows / 2));
            ASSERT_OK_AND_ASSIGN(Tensor bottom, Slice(t, 0, rows / 2, rows));
            views = {top, bottom};
            break;
          }
        }
        for (const Tensor& view : views) {
          ASSERT_NO_FATAL_FAILURE(
              PushAndRemember(*offloader, view, seed, saved[layer]));
        }
      }
    }
    ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
    sim_->RunUntilIdle();
    // Nothing leaks: every device and pinned byte came back (SPEC 6.7).
    EXPECT_EQ(sim_->device_memory().live_bytes, 0) << "iteration " << iteration;
    EXPECT_EQ(sim_->pinned_memory().live_bytes, 0) << "iteration " << iteration;
    EXPECT_EQ(offloader->OffloadedBytes(), 0) << "iteration " << iteration;
  }
  // Not vacuous: tensors went to host and came back.
  EXPECT_GT(offloader->stats().tensors_offloaded, 20);
  EXPECT_GT(offloader->stats().bytes_offloaded, 0);
  EXPECT_EQ(offloader->stats().bytes_reloaded,
            offloader->stats().bytes_offloaded);
}

// Pushing one tensor three times allocates one host copy (TE's test: CPU
// memory grows by exactly one tensor), and all three handles pop it.
TEST_F(OffloaderTest, PushingOneTensorThreeTimesCostsOneHostCopy) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  int64_t nbytes = 0;
  {
    ASSERT_OK_AND_ASSIGN(Tensor x,
                         MakeDeviceTensor(*sim_, DType::kBF16, {512, 1024}, 3));
    nbytes = x.nbytes();
    for (int i = 0; i < 3; ++i) {
      ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, x, 3, saved[0]));
    }
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));  // layer 0 released
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->state(0), GroupState::kOffloadFinished);
  EXPECT_EQ(offloader->OffloadedBytes(), nbytes);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, nbytes);
  EXPECT_EQ(offloader->stats().spans_offloaded, 1);
  EXPECT_EQ(offloader->stats().bytes_offloaded, nbytes);
  EXPECT_EQ(offloader->stats().pinned_allocations, 1);
  EXPECT_EQ(offloader->stats().tensors_offloaded, 3);
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);  // x is gone from device
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

// x[::2] and x[1::2] with the offload_base flag: one span, the whole of x,
// copied once; both views come back with their own strides and offsets, on
// one shared storage.
TEST_F(OffloaderTest, InterleavedHalvesWithOffloadBaseCostOneCopyOfTheBase) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  int64_t base_bytes = 0;
  {
    ASSERT_OK_AND_ASSIGN(Tensor x,
                         MakeDeviceTensor(*sim_, DType::kF32, {1024, 512}, 5));
    base_bytes = x.nbytes();
    ASSERT_OK_AND_ASSIGN(Tensor even, Slice(x, 0, 0, 1024, 2));
    ASSERT_OK_AND_ASSIGN(Tensor odd, Slice(x, 0, 1, 1024, 2));
    even.flags.offload_base = true;
    odd.flags.offload_base = true;
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, even, 5, saved[0]));
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, odd, 5, saved[0]));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  EXPECT_EQ(offloader->OffloadedBytes(), base_bytes);
  EXPECT_EQ(offloader->stats().spans_offloaded, 1);
  EXPECT_EQ(offloader->stats().views_made_contiguous, 0);

  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));  // reload of layer 0 starts here
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(Tensor even, offloader->Pop(saved[0][0].handle));
  ASSERT_OK_AND_ASSIGN(Tensor odd, offloader->Pop(saved[0][1].handle));
  EXPECT_EQ(even.storage.get(), odd.storage.get());
  EXPECT_EQ(even.strides, (std::vector<int64_t>{1024, 1}));
  EXPECT_EQ(odd.strides, (std::vector<int64_t>{1024, 1}));
  EXPECT_EQ(odd.offset - even.offset, 512);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> even_bytes,
                       ReadTensorBytes(*sim_, even));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> odd_bytes,
                       ReadTensorBytes(*sim_, odd));
  EXPECT_TRUE(BytesEqual(even_bytes, saved[0][0].expected));
  EXPECT_TRUE(BytesEqual(odd_bytes, saved[0][1].expected));
  ASSERT_OK(Consume(*sim_, {even, odd}));
  ASSERT_OK(offloader->FinishBackward());
}

// SPEC §2.1: the output of scaled_dot_product_attention reshaped — a
// contiguous view whose base tensor is strided — is offloaded (TE swapped it
// for its base and then rejected it). Saving both the view and the base
// costs one copy of their storage.
TEST_F(OffloaderTest, ContiguousViewOfStridedBaseRoundTrips) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  int64_t storage_bytes = 0;
  {
    // [B=2, S=256, H=8, D=64] bf16: the view has 256 Ki elements.
    ASSERT_OK_AND_ASSIGN(StridedBaseViews attention,
                         MakeAttentionOutput(*sim_, DType::kBF16, 2, 256, 8,
                                             64, 11));
    ASSERT_TRUE(attention.view.IsContiguous());
    ASSERT_FALSE(attention.base.IsContiguous());
    storage_bytes = attention.view.storage->size_bytes();
    ASSERT_NO_FATAL_FAILURE(
        PushAndRemember(*offloader, attention.view, 11, saved[0]));
    ASSERT_NO_FATAL_FAILURE(
        PushAndRemember(*offloader, attention.base, 11, saved[0]));
  }
  EXPECT_TRUE(saved[0][0].handle.in_group());
  EXPECT_TRUE(saved[0][1].handle.in_group());
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(offloader->OffloadedBytes(), storage_bytes);
  EXPECT_EQ(offloader->stats().spans_offloaded, 1);
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

// A sparse view (x[::8]) is made contiguous on the compute stream, with a
// warning naming the layer; only its own bytes go to host, and x's memory is
// freed (SPEC §2.2).
TEST_F(OffloaderTest, SparseViewIsMadeContiguousOnTheComputeStream) {
  OffloadOptions options = DefaultOptions(3, 1);
  options.min_offload_elements = 1024;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  std::vector<std::vector<Pushed>> saved(3);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  int64_t view_bytes = 0;
  {
    ASSERT_OK_AND_ASSIGN(Tensor x,
                         MakeDeviceTensor(*sim_, DType::kF32, {2048, 512}, 13));
    ASSERT_OK_AND_ASSIGN(Tensor sparse, Slice(x, 0, 0, 2048, 8));
    view_bytes = sparse.nbytes();
    ASSERT_NO_FATAL_FAILURE(PushAndRemember(*offloader, sparse, 13, saved[0]));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->stats().views_made_contiguous, 1);
  EXPECT_GE(offloader->diagnostics().Count("layer 0"), 1);
  EXPECT_EQ(offloader->OffloadedBytes(), view_bytes);
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  bool gathered_on_compute = false;
  for (const SimTraceEntry& entry : sim_->trace()) {
    if (entry.phase != SimPhase::kStart || entry.kind != SimOpKind::kGather) {
      continue;
    }
    EXPECT_EQ(entry.stream_name, "compute") << entry.ToString();
    gathered_on_compute = true;
  }
  EXPECT_TRUE(gathered_on_compute);

  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(saved[0][0].handle));
  EXPECT_EQ(popped.dtype, DType::kF32);
  EXPECT_EQ(popped.shape, (std::vector<int64_t>{256, 512}));
  // Pop's contract (offload.h): a view made contiguous comes back dense.
  EXPECT_EQ(popped.strides, (std::vector<int64_t>{512, 1}));
  EXPECT_EQ(popped.name, saved[0][0].geometry.name);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                       ReadTensorBytes(*sim_, popped));
  EXPECT_TRUE(BytesEqual(bytes, saved[0][0].expected));
  ASSERT_OK(offloader->FinishBackward());
}

// With skip_sparse_views the sparse view stays on device, with a warning,
// and comes back as it was pushed.
TEST_F(OffloaderTest, SparseViewStaysOnDeviceWithSkipSparseViews) {
  OffloadOptions options = DefaultOptions(3, 1);
  options.min_offload_elements = 1024;
  options.skip_sparse_views = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, options));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       MakeDeviceTensor(*sim_, DType::kF32, {2048, 512}, 17));
  ASSERT_OK_AND_ASSIGN(Tensor sparse, Slice(x, 0, 0, 2048, 8));
  const Storage* storage = x.storage.get();
  ASSERT_OK_AND_ASSIGN(SavedTensor handle, offloader->Push(sparse));
  const std::vector<uint8_t> expected = PatternTensorBytes(sparse, 17);
  x = Tensor();
  sparse = Tensor();
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  EXPECT_GE(offloader->diagnostics().Count("layer 0"), 1);
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  EXPECT_EQ(offloader->stats().views_made_contiguous, 0);
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(handle));
  EXPECT_EQ(popped.storage.get(), storage);
  EXPECT_EQ(popped.strides, (std::vector<int64_t>{4096, 1}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                       ReadTensorBytes(*sim_, popped));
  EXPECT_TRUE(BytesEqual(bytes, expected));
  ASSERT_OK(offloader->FinishBackward());
}

// A tensor saved by two layers (a residual): each offloaded layer copies it;
// its device memory stays while the other layer still holds it, and both
// handles pop it exactly.
TEST_F(OffloaderTest, TensorSavedByTwoOffloadedLayersRoundTrips) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(4, 2)));
  std::vector<std::vector<Pushed>> saved(4);
  {
    ASSERT_OK_AND_ASSIGN(Tensor residual,
                         MakeDeviceTensor(*sim_, DType::kBF16, {512, 1024}, 7));
    for (int layer = 0; layer < 4; ++layer) {
      ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(layer));
      if (layer < 2) {
        ASSERT_NO_FATAL_FAILURE(
            PushAndRemember(*offloader, residual, 7, saved[layer]));
      }
    }
  }
  EXPECT_EQ(offloader->OffloadedBytes(), 2 * kMiB);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);  // both released it
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
}

// ------------------------------------------------------------ composites

CompositeTensor MakeFp8Composite(SimBackend& sim, uint64_t seed) {
  CompositeTensor c;
  c.name = "fc1_input";
  c.metadata = {0x7E, 1, 2, 3, 0};
  // data [1024, 512] and its transpose as its own storage, 512 Ki fp8 each;
  // a small f32 scale (stays on device); one absent component.
  StatusOr<Tensor> data = MakeDeviceTensor(sim, DType::kFP8E4M3, {1024, 512},
                                           seed);
  StatusOr<Tensor> transpose = MakeDeviceTensor(sim, DType::kFP8E4M3,
                                                {512, 1024}, seed + 1);
  StatusOr<Tensor> scale = MakeDeviceTensor(sim, DType::kF32, {1024}, seed + 2);
  EXPECT_OK(data);
  EXPECT_OK(transpose);
  EXPECT_OK(scale);
  if (!data.ok() || !transpose.ok() || !scale.ok()) return c;
  c.components = {*data, *transpose, std::nullopt, *scale};
  return c;
}

// A composite (FP8 style) comes back equal: same components in the same
// places, absent ones absent, the same metadata and name; the small scale
// stays on device untouched.
TEST_F(OffloaderTest, CompositeRoundTrips) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  SavedTensor handle;
  std::vector<Tensor> geometry;
  std::vector<std::vector<uint8_t>> expected;
  const Storage* scale_storage = nullptr;
  {
    CompositeTensor c = MakeFp8Composite(*sim_, 21);
    ASSERT_THAT(c.components, SizeIs(4));
    scale_storage = c.components[3]->storage.get();
    // MakeFp8Composite's seeds: data 21, transpose 22, scale 23.
    const std::pair<int, uint64_t> kSeeds[] = {{0, 21}, {1, 22}, {3, 23}};
    for (const auto& [i, seed] : kSeeds) {
      geometry.push_back(Geometry(*c.components[i]));
      expected.push_back(PatternTensorBytes(*c.components[i], seed));
    }
    ASSERT_OK_AND_ASSIGN(handle, offloader->Push(c));
  }
  EXPECT_TRUE(handle.is_composite());
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->OffloadedBytes(), 2 * 512 * 1024);
  EXPECT_EQ(sim_->device_memory().live_bytes, 1024 * 4);  // only the scale
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(CompositeTensor popped, offloader->PopComposite(handle));
  EXPECT_EQ(popped.name, "fc1_input");
  EXPECT_THAT(popped.metadata, ElementsAreArray({0x7E, 1, 2, 3, 0}));
  ASSERT_THAT(popped.components, SizeIs(4));
  EXPECT_FALSE(popped.components[2].has_value());
  int k = 0;
  for (int i : {0, 1, 3}) {
    ASSERT_TRUE(popped.components[i].has_value()) << "component " << i;
    const Tensor& t = *popped.components[i];
    EXPECT_EQ(t.dtype, geometry[k].dtype);
    EXPECT_EQ(t.shape, geometry[k].shape);
    EXPECT_EQ(t.strides, geometry[k].strides);
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadTensorBytes(*sim_, t));
    EXPECT_TRUE(BytesEqual(bytes, expected[k])) << "component " << i;
    ++k;
  }
  EXPECT_EQ(popped.components[3]->storage.get(), scale_storage);
  ASSERT_OK(Consume(*sim_, {*popped.components[0], *popped.components[1],
                            *popped.components[3]}));
  ASSERT_OK(offloader->FinishBackward());
}

// Pushing a composite never modifies the caller's composite (upstream once
// corrupted it with a shallow copy): same storages, views, flags, events,
// metadata and bytes, through the offload and the release of its layer.
// The caller still holding the storages is reported (SPEC §2.5).
TEST_F(OffloaderTest, PushLeavesTheCallersCompositeUntouched) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  CompositeTensor c = MakeFp8Composite(*sim_, 31);
  ASSERT_THAT(c.components, SizeIs(4));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> ready, sim_->NewEvent());
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  c.components[0]->ready = std::move(ready);
  const CompositeTensor before = c;  // shares storages and events
  std::vector<std::vector<uint8_t>> bytes_before;
  for (int i : {0, 1, 3}) {
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                         ReadTensorBytes(*sim_, *c.components[i]));
    bytes_before.push_back(std::move(bytes));
  }
  ASSERT_OK_AND_ASSIGN(SavedTensor handle, offloader->Push(c));

  auto expect_untouched = [&](const std::string& when) {
    EXPECT_EQ(c.name, before.name) << when;
    EXPECT_EQ(c.metadata, before.metadata) << when;
    ASSERT_EQ(c.components.size(), before.components.size()) << when;
    EXPECT_FALSE(c.components[2].has_value()) << when;
    int k = 0;
    for (int i : {0, 1, 3}) {
      ASSERT_TRUE(c.components[i].has_value()) << when;
      const Tensor& now = *c.components[i];
      const Tensor& was = *before.components[i];
      EXPECT_EQ(now.storage.get(), was.storage.get()) << when << " " << i;
      EXPECT_EQ(now.ready.get(), was.ready.get()) << when << " " << i;
      EXPECT_EQ(now.dtype, was.dtype) << when << " " << i;
      EXPECT_EQ(now.shape, was.shape) << when << " " << i;
      EXPECT_EQ(now.strides, was.strides) << when << " " << i;
      EXPECT_EQ(now.offset, was.offset) << when << " " << i;
      EXPECT_EQ(now.name, was.name) << when << " " << i;
      EXPECT_EQ(now.flags.do_not_offload, was.flags.do_not_offload);
      EXPECT_EQ(now.flags.offload_base, was.flags.offload_base);
      ASSERT_NE(now.storage, nullptr) << when << " " << i;
      EXPECT_EQ(now.storage->size_bytes(), was.storage->size_bytes());
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                           ReadTensorBytes(*sim_, now));
      EXPECT_TRUE(BytesEqual(bytes, bytes_before[k])) << when << " " << i;
      ++k;
    }
  };
  expect_untouched("after Push");
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));  // offload starts
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));  // layer 0 released
  sim_->RunUntilIdle();
  expect_untouched("after the release of layer 0");
  EXPECT_EQ(offloader->stats().bytes_retained_by_caller, 2 * 512 * 1024);

  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK_AND_ASSIGN(CompositeTensor popped, offloader->PopComposite(handle));
  ASSERT_THAT(popped.components, SizeIs(4));
  for (int i : {0, 1, 3}) {
    ASSERT_TRUE(popped.components[i].has_value());
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                         ReadTensorBytes(*sim_, *popped.components[i]));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> original,
                         ReadTensorBytes(*sim_, *c.components[i]));
    EXPECT_TRUE(BytesEqual(bytes, original)) << "component " << i;
  }
  ASSERT_OK(offloader->FinishBackward());
  expect_untouched("after the backward");
}

// -------------------------------------------------------- pass-through

// SPEC §1.2: small tensors, parameters, weights, do-not-offload tensors and
// tensors in host memory come back from Pop as the very same view (same
// storage) and cost no host bytes, even in an offloaded layer.
TEST_F(OffloaderTest, NeverOffloadedTensorsComeBackUnchangedAndCostNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  ASSERT_TRUE(offloader->WillOffload(0));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  std::vector<Tensor> tensors;
  {
    ASSERT_OK_AND_ASSIGN(Tensor small,  // one element short of the minimum
                         MakeDeviceTensor(*sim_, DType::kF32, {256 * 1024 - 1},
                                          41));
    ASSERT_OK_AND_ASSIGN(Tensor parameter,
                         MakeDeviceTensor(*sim_, DType::kBF16, {1024, 1024}, 42));
    parameter.flags.parameter = true;
    ASSERT_OK_AND_ASSIGN(Tensor weight,
                         MakeDeviceTensor(*sim_, DType::kBF16, {1024, 1024}, 43));
    weight.flags.weight = true;
    ASSERT_OK_AND_ASSIGN(Tensor marked,
                         MakeDeviceTensor(*sim_, DType::kF32, {512, 1024}, 44));
    MarkNotOffload(marked);
    ASSERT_OK_AND_ASSIGN(Buffer pinned, sim_->AllocatePinned(4 * kMiB));
    Tensor host;
    host.dtype = DType::kF32;
    host.shape = {kMiB};
    host.strides = {1};
    host.storage = std::make_shared<Storage>(std::move(pinned));
    host.name = "host";
    tensors = {small, parameter, weight, marked, host};
  }
  std::vector<SavedTensor> handles;
  for (const Tensor& t : tensors) {
    ASSERT_OK_AND_ASSIGN(SavedTensor handle, offloader->Push(t));
    EXPECT_FALSE(handle.in_group()) << t.Describe();
    EXPECT_EQ(handle.layer(), 0);
    handles.push_back(std::move(handle));
  }
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  sim_->RunUntilIdle();
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  EXPECT_EQ(offloader->stats().tensors_kept, 5);
  EXPECT_EQ(offloader->stats().tensors_offloaded, 0);
  EXPECT_EQ(offloader->stats().spans_offloaded, 0);
  EXPECT_EQ(offloader->stats().pinned_allocations, 0);
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  ASSERT_OK(offloader->BackwardStep(0));
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(handles[i]));
    EXPECT_EQ(popped.storage.get(), tensors[i].storage.get())
        << tensors[i].Describe();
    EXPECT_EQ(popped.shape, tensors[i].shape);
    EXPECT_EQ(popped.strides, tensors[i].strides);
    EXPECT_EQ(popped.offset, tensors[i].offset);
    EXPECT_EQ(popped.flags.parameter, tensors[i].flags.parameter);
    EXPECT_EQ(popped.flags.weight, tensors[i].flags.weight);
    EXPECT_EQ(popped.flags.do_not_offload, tensors[i].flags.do_not_offload);
  }
  ASSERT_OK(offloader->FinishBackward());
  sim_->RunUntilIdle();
}

// SPEC §4.4: a layer the schedule does not offload skips all work on push:
// nothing is enqueued (not even a ready event), nothing is counted, and Pop
// returns the tensor itself.
TEST_F(OffloaderTest, LayersNotOffloadedByTheScheduleCostNothingOnPush) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(3, 1)));
  EXPECT_FALSE(offloader->WillOffload(1));
  EXPECT_FALSE(offloader->WillOffload(2));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(0));
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(1));
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       MakeDeviceTensor(*sim_, DType::kF32, {1024, 1024}, 51));
  const std::string before = Snapshot(*offloader, *sim_, 3);
  std::vector<SavedTensor> handles;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(SavedTensor handle, offloader->Push(x));
    EXPECT_FALSE(handle.in_group());
    EXPECT_EQ(handle.layer(), 1);
    handles.push_back(std::move(handle));
  }
  EXPECT_EQ(Snapshot(*offloader, *sim_, 3), before);
  ASSERT_THAT(offloader->ForwardStep(), IsOkAndHolds(2));
  ASSERT_OK(offloader->BackwardStep(2));
  ASSERT_OK(offloader->BackwardStep(1));
  for (const SavedTensor& handle : handles) {
    ASSERT_OK_AND_ASSIGN(Tensor popped, offloader->Pop(handle));
    EXPECT_EQ(popped.storage.get(), x.storage.get());
  }
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
  ASSERT_OK(offloader->BackwardStep(0));
  ASSERT_OK(offloader->FinishBackward());
}

// ------------------------------------------------------------ memory

// k = n-1: layer i is released when layer i+1 begins its forward, before
// any of layer i+1's tensors are allocated (the release comes first in
// compute-stream order: ForwardStep makes the compute stream wait for the
// copies and frees), and reloaded when its own backward begins, after the
// previous backward layer's memory was released. So nothing beyond one
// layer's activations is inherent: the device high-water mark of the whole
// step is exactly one layer, and memory returns to the start afterwards.
TEST_F(OffloaderTest, AllButOneLayerOffloadedKeepsOneLayerResident) {
  constexpr int kLayers = 4;
  constexpr int64_t kLayerBytes = 2 * kMiB;  // two f32 [256 Ki] per layer
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Offloader> offloader,
                       Offloader::Create(*sim_, DefaultOptions(kLayers, 3)));
  sim_->RunUntilIdle();
  const int64_t start = sim_->device_memory().live_bytes;
  ASSERT_EQ(start, 0);
  std::vector<std::vector<Pushed>> saved;
  ASSERT_NO_FATAL_FAILURE(ForwardUniform(*offloader, kLayers, 2, saved));
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().peak_bytes, kLayerBytes)
      << "high-water mark during forward";
  EXPECT_EQ(sim_->device_memory().live_bytes, kLayerBytes);  // the last layer
  EXPECT_EQ(offloader->OffloadedBytes(), 3 * kLayerBytes);
  ASSERT_NO_FATAL_FAILURE(BackwardAll(*offloader, saved));
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().peak_bytes, kLayerBytes)
      << "high-water mark of the whole step";
  EXPECT_EQ(sim_->device_memory().live_bytes, start);
  EXPECT_EQ(offloader->OffloadedBytes(), 0);
}

// TE's memory test: device memory after the offload plus the host bytes
// offloaded equals device memory without offloading.
TEST_F(OffloaderTest, MemoryAfterOffloadPlusOffloadedBytesEqualsMemoryWithout) {
  constexpr int kLayers = 4;
  struct AfterForward {
    int64_t device_live = 0;
    int64_t offloaded = 0;
  };
  // The forward of kLayers layers, each saving two 1 MiB tensors and one
  // small one, with `offloaded` layers offloaded; measured after the last
  // layer's forward; then the backward.
  auto run = [&](SimBackend& sim, int offloaded) -> AfterForward {
    AfterForward result;
    StatusOr<std::unique_ptr<Offloader>> created =
        Offloader::Create(sim, DefaultOptions(kLayers, offloaded));
    EXPECT_OK(created);
    if (!created.ok()) return result;
    Offloader& offloader = **created;
    std::vector<std::vector<SavedTensor>> handles(kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      EXPECT_THAT(offloader.ForwardStep(), IsOkAndHolds(layer));
      for (int i = 0; i < 3; ++i) {
        std::vector<int64_t> shape = {i < 2 ? 256 * 1024 : 1000};
        StatusOr<Tensor> t =
            MakeDeviceTensor(sim, DType::kF32, shape, 10 * layer + i);
        EXPECT_OK(t);
        if (!t.ok()) return result;
        StatusOr<SavedTensor> handle = offloader.Push(*t);
        EXPECT_OK(handle);
        if (handle.ok()) handles[layer].push_back(*std::move(handle));
      }
    }
    sim.RunUntilIdle();
    result.device_live = sim.device_memory().live_bytes;
    result.offloaded = offloader.OffloadedBytes();
    for (int layer = kLayers - 1; layer >= 0; --layer) {
      EXPECT_OK(offloader.BackwardStep(layer));
      std::vector<Tensor> popped;
      for (const SavedTensor& handle : handles[layer]) {
        StatusOr<Tensor> t = offloader.Pop(handle);
        EXPECT_OK(t);
        if (t.ok()) popped.push_back(*std::move(t));
      }
      EXPECT_OK(Consume(sim, popped));
      handles[layer].clear();
    }
    EXPECT_OK(offloader.FinishBackward());
    sim.RunUntilIdle();
    return result;
  };
  std::unique_ptr<SimBackend> baseline_sim = NewSimBackend(SimOptions{});
  const AfterForward without = run(*baseline_sim, 0);
  const AfterForward with = run(*sim_, 2);
  EXPECT_THAT(baseline_sim->hazards(), IsEmpty());
  EXPECT_EQ(without.offloaded, 0);
  EXPECT_EQ(with.offloaded, 2 * 2 * kMiB);
  EXPECT_EQ(with.device_live + with.offloaded, without.device_live);
  EXPECT_EQ(without.device_live, kLayers * (2 * kMiB + 4000));
}

}  // namespace
}  // namespace offload_test
}  // namespace offload
