#include "testing/backend_conformance.h"

#include <cctype>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/conformance_bytes.h"
#include "testing/status_matchers.h"

namespace offload {

void PrintTo(const BackendFactory& factory, std::ostream* os) {
  *os << "BackendFactory{" << factory.name << "}";
}

std::string BackendFactoryName::operator()(
    const ::testing::TestParamInfo<BackendFactory>& info) const {
  std::string name = info.param.name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  if (name.empty()) name = "Backend" + std::to_string(info.index);
  return name;
}

void BackendConformanceTest::SetUp() {
  ASSERT_TRUE(GetParam().make)
      << "BackendFactory '" << GetParam().name << "' has no make function";
  backend_ = GetParam().make();
  ASSERT_NE(backend_, nullptr)
      << "BackendFactory '" << GetParam().name << "' returned nullptr";
}

void BackendConformanceTest::TearDown() {
  if (backend_ == nullptr) return;
  EXPECT_OK(backend_->ComputeStream().Synchronize()) << "compute stream";
  for (Stream* stream : streams_) {
    EXPECT_OK(stream->Synchronize()) << "stream '" << stream->name() << "'";
  }
  if (GetParam().verify) {
    EXPECT_OK(GetParam().verify(*backend_)) << "the factory's verify hook";
  }
}

StatusOr<Stream*> BackendConformanceTest::NewStream(std::string_view name) {
  StatusOr<Stream*> stream = backend_->NewStream(name);
  if (stream.ok() && *stream != nullptr) streams_.push_back(*stream);
  return stream;
}

namespace {

using ::testing::IsNull;
using ::testing::NotNull;

using conformance::At;
using conformance::BytesAt;
using conformance::EnqueueReadBack;
using conformance::FillPinned;
using conformance::HoldsPattern;
using conformance::kKiB;
using conformance::kMiB;
using conformance::PinnedWithPattern;

// ---------------------------------------------------------------------------
// Events.

TEST_P(BackendConformanceTest, NeverRecordedEventIsComplete) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
  ASSERT_THAT(event, NotNull());
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
  EXPECT_OK(event->Synchronize());
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
}

TEST_P(BackendConformanceTest, EventRecordedOnIdleStreamCompletes) {
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("idle"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
  ASSERT_OK(stream->Record(*event));
  ASSERT_OK(event->Synchronize());
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
}

TEST_P(BackendConformanceTest, WaitOnNeverRecordedEventIsNoOp) {
  const int64_t n = 64 * kKiB;
  ASSERT_OK_AND_ASSIGN(Stream* side, NewStream("side"));
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
  ASSERT_OK(side->Wait(*event));
  ASSERT_OK(compute.Wait(*event));

  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 1));
  ASSERT_OK_AND_ASSIGN(Buffer on_side, backend().AllocateDevice(n, *side));
  ASSERT_OK_AND_ASSIGN(Buffer on_compute, backend().AllocateDevice(n, compute));
  ASSERT_OK(side->Copy(on_side.data(), src.data(), n));
  ASSERT_OK(compute.Copy(on_compute.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer side_dst,
                       EnqueueReadBack(backend(), *side, on_side.data(), n));
  ASSERT_OK_AND_ASSIGN(
      Buffer compute_dst,
      EnqueueReadBack(backend(), compute, on_compute.data(), n));
  ASSERT_OK(side->Synchronize());
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(side_dst, 1));
  EXPECT_TRUE(HoldsPattern(compute_dst, 1));
}

TEST_P(BackendConformanceTest, EventSynchronizeMakesCopiedBytesVisible) {
  const int64_t n = 4 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("copies"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 7));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));
  ASSERT_OK(stream->Copy(device.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend(), *stream, device.data(), n));
  ASSERT_OK(stream->Record(*event));
  // Only the event is waited for: it alone must make the bytes visible.
  ASSERT_OK(event->Synchronize());
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
  EXPECT_TRUE(HoldsPattern(dst, 7));
}

// Writes device memory on stream `a`, orders `b` after it with an event, and
// reads it back on `b`. `a` first gets a queue of unrelated copies, so on a
// real device an unordered read on `b` would very likely see stale bytes.
void CheckWaitOrdersAcrossStreams(Backend& backend, Stream& a, Stream& b,
                                  uint64_t seed) {
  const int64_t n = 4 * kMiB;
  const int64_t filler = 16 * kMiB;
  ASSERT_OK_AND_ASSIGN(Buffer filler_src,
                       PinnedWithPattern(backend, filler, 0));
  ASSERT_OK_AND_ASSIGN(Buffer filler1, backend.AllocateDevice(filler, a));
  ASSERT_OK_AND_ASSIGN(Buffer filler2, backend.AllocateDevice(filler, a));
  ASSERT_OK(a.Copy(filler1.data(), filler_src.data(), filler));
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(a.Copy(filler2.data(), filler1.data(), filler));
    ASSERT_OK(a.Copy(filler1.data(), filler2.data(), filler));
  }
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend, n, seed));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend.AllocateDevice(n, a));
  ASSERT_OK(a.Copy(device.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> written, backend.NewEvent());
  ASSERT_OK(a.Record(*written));

  ASSERT_OK(b.Wait(*written));
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend, b, device.data(), n));
  // Only `b` is synchronized before reading: the wait must have pulled in
  // the write on `a`.
  ASSERT_OK(b.Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, seed))
      << "written on '" << a.name() << "', read on '" << b.name() << "'";
  ASSERT_OK(a.Synchronize());
  // Free the device memory and wait for the frees, so that a later check
  // can have the memory again on any stream.
  ASSERT_OK(backend.Free(filler1, a));
  ASSERT_OK(backend.Free(filler2, a));
  ASSERT_OK(backend.Free(device, a));
  ASSERT_OK(a.Synchronize());
}

TEST_P(BackendConformanceTest, WaitOrdersWorkAcrossStreams) {
  ASSERT_OK_AND_ASSIGN(Stream* side, NewStream("side"));
  Stream& compute = backend().ComputeStream();
  {
    SCOPED_TRACE("compute -> side");
    ASSERT_NO_FATAL_FAILURE(
        CheckWaitOrdersAcrossStreams(backend(), compute, *side, 11));
  }
  {
    SCOPED_TRACE("side -> compute");
    ASSERT_NO_FATAL_FAILURE(
        CheckWaitOrdersAcrossStreams(backend(), *side, compute, 12));
  }
}

TEST_P(BackendConformanceTest, ReRecordedEventCapturesLaterWork) {
  const int64_t n = 2 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("rerecord"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(Buffer src1, PinnedWithPattern(backend(), n, 21));
  ASSERT_OK_AND_ASSIGN(Buffer src2, PinnedWithPattern(backend(), n, 22));
  ASSERT_OK_AND_ASSIGN(Buffer dev1, backend().AllocateDevice(n, *stream));
  ASSERT_OK_AND_ASSIGN(Buffer dev2, backend().AllocateDevice(n, *stream));

  ASSERT_OK(stream->Copy(dev1.data(), src1.data(), n));
  ASSERT_OK(stream->Record(*event));
  ASSERT_OK_AND_ASSIGN(Buffer dst1,
                       EnqueueReadBack(backend(), *stream, dev1.data(), n));
  ASSERT_OK(stream->Copy(dev2.data(), src2.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dst2,
                       EnqueueReadBack(backend(), *stream, dev2.data(), n));
  ASSERT_OK(stream->Record(*event));

  ASSERT_OK(event->Synchronize());
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
  EXPECT_TRUE(HoldsPattern(dst1, 21));
  EXPECT_TRUE(HoldsPattern(dst2, 22));
}

// A Wait binds to the Record made before it (or to nothing, for a
// never-recorded event). If a backend bound it to a later Record instead,
// the two streams below would wait for each other forever.
TEST_P(BackendConformanceTest, WaitBindsToTheRecordBeforeIt) {
  const int64_t n = 256 * kKiB;
  ASSERT_OK_AND_ASSIGN(Stream* a, NewStream("a"));
  ASSERT_OK_AND_ASSIGN(Stream* b, NewStream("b"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> on_a, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> on_b, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(Buffer src1, PinnedWithPattern(backend(), n, 31));
  ASSERT_OK_AND_ASSIGN(Buffer src2, PinnedWithPattern(backend(), n, 32));
  ASSERT_OK_AND_ASSIGN(Buffer src3, PinnedWithPattern(backend(), n, 33));
  ASSERT_OK_AND_ASSIGN(Buffer dev_b, backend().AllocateDevice(n, *b));
  ASSERT_OK_AND_ASSIGN(Buffer dev_a, backend().AllocateDevice(n, *a));

  // Round 1: `on_a` was never recorded, so b's wait is a no-op; `a` then
  // waits for b and records `on_a`.
  ASSERT_OK(b->Copy(dev_b.data(), src1.data(), n));
  ASSERT_OK(b->Wait(*on_a));
  ASSERT_OK_AND_ASSIGN(Buffer dst1,
                       EnqueueReadBack(backend(), *b, dev_b.data(), n));
  ASSERT_OK(b->Record(*on_b));
  ASSERT_OK(a->Wait(*on_b));
  ASSERT_OK(a->Copy(dev_a.data(), src2.data(), n));
  ASSERT_OK(a->Record(*on_a));

  // Round 2: b waits for a's write of dev_a and reads it; `a` then waits
  // for that read, overwrites dev_a and records `on_a` again.
  ASSERT_OK(b->Wait(*on_a));
  ASSERT_OK_AND_ASSIGN(Buffer dst2,
                       EnqueueReadBack(backend(), *b, dev_a.data(), n));
  ASSERT_OK(b->Record(*on_b));
  ASSERT_OK(a->Wait(*on_b));
  ASSERT_OK(a->Copy(dev_a.data(), src3.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dst3,
                       EnqueueReadBack(backend(), *a, dev_a.data(), n));
  ASSERT_OK(a->Record(*on_a));

  ASSERT_OK(b->Synchronize());
  ASSERT_OK(a->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst1, 31));
  EXPECT_TRUE(HoldsPattern(dst2, 32));
  EXPECT_TRUE(HoldsPattern(dst3, 33));
}

TEST_P(BackendConformanceTest, EventMayBeDestroyedBeforeItsWorkCompletes) {
  const int64_t n = 1 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* a, NewStream("a"));
  ASSERT_OK_AND_ASSIGN(Stream* b, NewStream("b"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 41));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *a));
  ASSERT_OK(a->Copy(device.data(), src.data(), n));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend().NewEvent());
    ASSERT_OK(a->Record(*event));
    ASSERT_OK(b->Wait(*event));
  }  // The event is gone; b's wait must still hold.
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend(), *b, device.data(), n));
  ASSERT_OK(b->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 41));
  ASSERT_OK(a->Synchronize());
}

// ---------------------------------------------------------------------------
// FIFO order within a stream.

TEST_P(BackendConformanceTest, CopiesOnOneStreamRunInOrder) {
  const int64_t n = 8 * kMiB + 3;  // odd on purpose
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("fifo"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 51));
  ASSERT_OK_AND_ASSIGN(Buffer dev1, backend().AllocateDevice(n, *stream));
  ASSERT_OK_AND_ASSIGN(Buffer dev2, backend().AllocateDevice(n, *stream));
  ASSERT_OK_AND_ASSIGN(Buffer dst1, backend().AllocatePinned(n));
  ASSERT_OK_AND_ASSIGN(Buffer dst2, backend().AllocatePinned(n));
  // pinned -> device -> device -> pinned -> pinned, each reading what the
  // previous copy wrote.
  ASSERT_OK(stream->Copy(dev1.data(), src.data(), n));
  ASSERT_OK(stream->Copy(dev2.data(), dev1.data(), n));
  ASSERT_OK(stream->Copy(dst1.data(), dev2.data(), n));
  ASSERT_OK(stream->Copy(dst2.data(), dst1.data(), n));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst1, 51));
  EXPECT_TRUE(HoldsPattern(dst2, 51));
}

TEST_P(BackendConformanceTest, GatherWritesTheViewDenselyInRowMajorOrder) {
  // A [64, 96] 2-byte tensor; gather the view x[8:40:2, 5:85:4] transposed:
  // shape [20, 16], element strides [4, 192], offset 8 * 96 + 5.
  const int64_t rows = 64, cols = 96, esize = 2;
  const int64_t n = rows * cols * esize;
  const std::vector<int64_t> shape = {20, 16};
  const std::vector<int64_t> strides = {4, 2 * cols};
  const int64_t offset = 8 * cols + 5;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("gather"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 91));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));
  ASSERT_OK_AND_ASSIGN(Buffer dense,
                       backend().AllocateDevice(20 * 16 * esize, *stream));
  ASSERT_OK(stream->Copy(device.data(), src.data(), n));
  ASSERT_OK(stream->Gather(dense.data(), At(device, offset * esize), esize,
                           shape, strides));
  // A view of no elements gathers nothing.
  ASSERT_OK(stream->Gather(dense.data(), device.data(), esize, {0, 3}, {3, 1}));
  ASSERT_OK_AND_ASSIGN(Buffer out, EnqueueReadBack(backend(), *stream,
                                                   dense.data(), 20 * 16 * esize));
  ASSERT_OK(stream->Synchronize());
  const std::vector<uint8_t> all = PatternBytes(0, n, 91);
  std::vector<uint8_t> expected;
  for (int64_t i = 0; i < 20; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      int64_t element = offset + i * strides[0] + j * strides[1];
      expected.push_back(all[element * esize]);
      expected.push_back(all[element * esize + 1]);
    }
  }
  EXPECT_TRUE(BytesAt(out, 0, expected));
  EXPECT_THAT(stream->Gather(dense.data(), device.data(), 0, {4}, {1}),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(BackendConformanceTest, LaterWriteToTheSameRangeWins) {
  const int64_t n = 1 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("fifo"));
  ASSERT_OK_AND_ASSIGN(Buffer src_a, PinnedWithPattern(backend(), n, 61));
  ASSERT_OK_AND_ASSIGN(Buffer src_b, PinnedWithPattern(backend(), n, 62));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));

  // Whole range: A then B.
  ASSERT_OK(stream->Copy(device.data(), src_a.data(), n));
  ASSERT_OK(stream->Copy(device.data(), src_b.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer whole,
                       EnqueueReadBack(backend(), *stream, device.data(), n));

  // A over everything, then B over the middle half, through addresses inside
  // the allocations on both sides.
  const int64_t begin = n / 4 + 1;
  const int64_t end = begin + n / 2;
  ASSERT_OK(stream->Copy(device.data(), src_a.data(), n));
  ASSERT_OK(stream->Copy(At(device, begin), At(src_b, begin), end - begin));
  ASSERT_OK_AND_ASSIGN(Buffer mixed,
                       EnqueueReadBack(backend(), *stream, device.data(), n));
  ASSERT_OK(stream->Synchronize());

  EXPECT_TRUE(HoldsPattern(whole, 62));
  EXPECT_TRUE(BytesAt(mixed, 0, PatternBytes(0, begin, 61)));
  EXPECT_TRUE(BytesAt(mixed, begin, PatternBytes(begin, end, 62)));
  EXPECT_TRUE(BytesAt(mixed, end, PatternBytes(end, n, 61)));
}

// ---------------------------------------------------------------------------
// Errors of allocation, Copy and Free.

TEST_P(BackendConformanceTest, AllocationRejectsNonPositiveSizes) {
  Stream& compute = backend().ComputeStream();
  for (int64_t bytes : {int64_t{0}, int64_t{-1}, int64_t{-4096},
                        std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(bytes);
    EXPECT_THAT(backend().AllocateDevice(bytes, compute),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(backend().AllocatePinned(bytes),
                StatusIs(StatusCode::kInvalidArgument));
  }
}

TEST_P(BackendConformanceTest, AllocationBeyondCapacityFailsCleanly) {
  Stream& compute = backend().ComputeStream();
  for (int64_t bytes :
       {int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(bytes);
    EXPECT_THAT(backend().AllocateDevice(bytes, compute),
                StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(backend().AllocatePinned(bytes),
                StatusIs(StatusCode::kResourceExhausted));
  }
  // The failures changed nothing: ordinary allocations work and hold data.
  const int64_t n = 1 * kMiB;
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 71));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, compute));
  ASSERT_OK(compute.Copy(device.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend(), compute, device.data(), n));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 71));
}

TEST_P(BackendConformanceTest, CopyRejectsInvalidArguments) {
  const int64_t n = 64 * kKiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("copies"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 81));
  ASSERT_OK_AND_ASSIGN(Buffer dst, PinnedWithPattern(backend(), n, 82));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));

  for (int64_t bytes : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    EXPECT_THAT(stream->Copy(dst.data(), src.data(), bytes),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(stream->Copy(device.data(), src.data(), bytes),
                StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(stream->Copy(nullptr, src.data(), n),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(stream->Copy(dst.data(), nullptr, n),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(stream->Copy(nullptr, nullptr, n),
              StatusIs(StatusCode::kInvalidArgument));
  // Zero bytes is valid and copies nothing.
  EXPECT_OK(stream->Copy(dst.data(), src.data(), 0));
  EXPECT_OK(stream->Copy(device.data(), src.data(), 0));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 82)) << "a rejected or empty copy wrote bytes";

  // The stream still works.
  ASSERT_OK(stream->Copy(device.data(), src.data(), n));
  ASSERT_OK(stream->Copy(dst.data(), device.data(), n));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 81));
}

TEST_P(BackendConformanceTest, FreeRejectsEmptyBuffers) {
  Stream& compute = backend().ComputeStream();
  Buffer never_allocated;
  EXPECT_THAT(backend().Free(never_allocated, compute),
              StatusIs(StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(4096, compute));
  Buffer moved_to = std::move(device);
  EXPECT_TRUE(device.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_THAT(backend().Free(device, compute),  // NOLINT
              StatusIs(StatusCode::kInvalidArgument));

  ASSERT_OK(backend().Free(moved_to, compute));
  EXPECT_TRUE(moved_to.empty());
  EXPECT_THAT(backend().Free(moved_to, compute),
              StatusIs(StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(Buffer pinned, backend().AllocatePinned(4096));
  ASSERT_OK(backend().Free(pinned, compute));
  EXPECT_TRUE(pinned.empty());
  EXPECT_THAT(backend().Free(pinned, compute),
              StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(compute.Synchronize());
}

// A second backend made by the same factory is foreign: its buffers, streams
// and events are rejected, and the rejected calls leave everything usable.
TEST_P(BackendConformanceTest, ObjectsOfAnotherBackendAreRejected) {
  const int64_t n = 256 * kKiB;
  std::unique_ptr<Backend> other = GetParam().make();
  ASSERT_THAT(other, NotNull());
  Stream& compute = backend().ComputeStream();
  Stream& other_compute = other->ComputeStream();

  ASSERT_OK_AND_ASSIGN(Buffer other_src, PinnedWithPattern(*other, n, 91));
  ASSERT_OK_AND_ASSIGN(Buffer other_device,
                       other->AllocateDevice(n, other_compute));
  void* const other_src_data = other_src.data();
  void* const other_device_data = other_device.data();

  // Another backend's buffers.
  EXPECT_THAT(backend().Free(other_device, compute),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(backend().Free(other_src, compute),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(other_device.data(), other_device_data);
  EXPECT_EQ(other_device.size(), n);
  EXPECT_EQ(other_device.owner(), other.get());
  EXPECT_EQ(other_device.stream(), &other_compute);
  EXPECT_EQ(other_src.data(), other_src_data);
  EXPECT_EQ(other_src.size(), n);
  EXPECT_EQ(other_src.owner(), other.get());

  // Another backend's stream.
  ASSERT_OK_AND_ASSIGN(Buffer own, backend().AllocateDevice(n, compute));
  void* const own_data = own.data();
  EXPECT_THAT(backend().Free(own, other_compute),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(own.data(), own_data);
  EXPECT_EQ(own.owner(), &backend());
  EXPECT_THAT(backend().AllocateDevice(n, other_compute),
              StatusIs(StatusCode::kInvalidArgument));

  // Another backend's event (recorded there first, so that Wait cannot be a
  // no-op for a never-recorded event).
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> other_event, other->NewEvent());
  ASSERT_OK(other_compute.Copy(other_device.data(), other_src.data(), n));
  ASSERT_OK(other_compute.Record(*other_event));
  EXPECT_THAT(compute.Record(*other_event),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(compute.Wait(*other_event),
              StatusIs(StatusCode::kInvalidArgument));

  // Everything still works where it belongs.
  ASSERT_OK_AND_ASSIGN(
      Buffer other_dst,
      EnqueueReadBack(*other, other_compute, other_device.data(), n));
  ASSERT_OK(other_compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(other_dst, 91));
  ASSERT_OK(backend().Free(own, compute));
  ASSERT_OK(compute.Synchronize());
}

// ---------------------------------------------------------------------------
// Stream-ordered reuse of freed memory.

TEST_P(BackendConformanceTest, FreedDeviceMemoryIsReusedOnlyAfterEarlierWork) {
  const int64_t n = 8 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("reuse"));
  ASSERT_OK_AND_ASSIGN(Buffer src_x, PinnedWithPattern(backend(), n, 101));
  ASSERT_OK_AND_ASSIGN(Buffer src_y, PinnedWithPattern(backend(), n, 102));
  ASSERT_OK_AND_ASSIGN(Buffer x, backend().AllocateDevice(n, *stream));
  ASSERT_OK(stream->Copy(x.data(), src_x.data(), n));
  ASSERT_OK(stream->Synchronize());
  // From here on nothing waits until the end: the read of X is still queued
  // when X is freed and Y allocated.
  ASSERT_OK_AND_ASSIGN(Buffer read_x,
                       EnqueueReadBack(backend(), *stream, x.data(), n));
  ASSERT_OK(backend().Free(x, *stream));
  EXPECT_TRUE(x.empty());
  // Y may get X's memory: its writes are ordered after X's read-back.
  ASSERT_OK_AND_ASSIGN(Buffer y, backend().AllocateDevice(n, *stream));
  ASSERT_OK(stream->Copy(y.data(), src_y.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer read_y,
                       EnqueueReadBack(backend(), *stream, y.data(), n));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(HoldsPattern(read_x, 101));
  EXPECT_TRUE(HoldsPattern(read_y, 102));
}

// Memory freed on one stream must not go to work on another stream that is
// not ordered after the free.
TEST_P(BackendConformanceTest, FreedDeviceMemoryIsNotGivenToUnorderedWork) {
  const int64_t n = 8 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* s, NewStream("s"));
  ASSERT_OK_AND_ASSIGN(Stream* t, NewStream("t"));
  ASSERT_OK_AND_ASSIGN(Buffer src_x, PinnedWithPattern(backend(), n, 111));
  ASSERT_OK_AND_ASSIGN(Buffer src_y, PinnedWithPattern(backend(), n, 112));
  ASSERT_OK_AND_ASSIGN(Buffer x, backend().AllocateDevice(n, *s));
  ASSERT_OK(s->Copy(x.data(), src_x.data(), n));
  ASSERT_OK(s->Synchronize());
  // X's read-back is still queued on `s` when X is freed; `t` is not ordered
  // after it, so Y must not get X's memory.
  ASSERT_OK_AND_ASSIGN(Buffer read_x,
                       EnqueueReadBack(backend(), *s, x.data(), n));
  ASSERT_OK(backend().Free(x, *s));
  ASSERT_OK_AND_ASSIGN(Buffer y, backend().AllocateDevice(n, *t));
  ASSERT_OK(t->Copy(y.data(), src_y.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer read_y,
                       EnqueueReadBack(backend(), *t, y.data(), n));
  ASSERT_OK(t->Synchronize());
  ASSERT_OK(s->Synchronize());
  EXPECT_TRUE(HoldsPattern(read_x, 111));
  EXPECT_TRUE(HoldsPattern(read_y, 112));
}

// Pinned memory freed on a stream stays intact for the copies enqueued
// before the free, even if the host allocates and writes pinned memory at
// once afterwards.
TEST_P(BackendConformanceTest, FreedPinnedMemoryIsNotReusedBeforeEarlierWork) {
  const int64_t n = 8 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("pinned"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 121));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));
  ASSERT_OK(stream->Copy(device.data(), src.data(), n));
  ASSERT_OK(backend().Free(src, *stream));
  EXPECT_TRUE(src.empty());
  ASSERT_OK_AND_ASSIGN(Buffer fresh, PinnedWithPattern(backend(), n, 122));
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend(), *stream, device.data(), n));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 121));
  EXPECT_TRUE(HoldsPattern(fresh, 122));
}

// Many allocate/write/read/free rounds on one stream with no host wait in
// between, so freed memory is handed out again while earlier rounds are
// still queued. Odd sizes; even rounds free with Free, odd rounds by
// destroying the handle.
TEST_P(BackendConformanceTest, ManyStreamOrderedAllocationRounds) {
  constexpr int kRounds = 50;
  ASSERT_OK_AND_ASSIGN(Stream* stream, NewStream("rounds"));
  std::vector<Buffer> sources;
  std::vector<Buffer> results;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    const int64_t n = 64 * kKiB + round * 4 * kKiB + round;
    const uint64_t seed = 1000 + round;
    ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, seed));
    ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *stream));
    ASSERT_OK(stream->Copy(device.data(), src.data(), n));
    ASSERT_OK_AND_ASSIGN(Buffer dst,
                         EnqueueReadBack(backend(), *stream, device.data(), n));
    if (round % 2 == 0) {
      ASSERT_OK(backend().Free(device, *stream));
    }
    sources.push_back(std::move(src));
    results.push_back(std::move(dst));
  }
  ASSERT_OK(stream->Synchronize());
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_TRUE(HoldsPattern(results[round], 1000 + round))
        << "round " << round;
  }
}

TEST_P(BackendConformanceTest, DeviceMemoryAllocatedOnOneStreamUsedOnAnother) {
  const int64_t n = 2 * kMiB;
  ASSERT_OK_AND_ASSIGN(Stream* a, NewStream("a"));
  ASSERT_OK_AND_ASSIGN(Stream* b, NewStream("b"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 131));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> allocated, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(Buffer device, backend().AllocateDevice(n, *a));
  EXPECT_EQ(device.stream(), a);
  ASSERT_OK(a->Record(*allocated));
  ASSERT_OK(b->Wait(*allocated));
  ASSERT_OK(b->Copy(device.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dst,
                       EnqueueReadBack(backend(), *b, device.data(), n));
  // Freed on the stream that used it, not the one it was allocated on.
  ASSERT_OK(backend().Free(device, *b));
  ASSERT_OK(b->Synchronize());
  ASSERT_OK(a->Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 131));
}

// ---------------------------------------------------------------------------
// Buffer handles.

TEST_P(BackendConformanceTest, BuffersDescribeTheirMemory) {
  ASSERT_OK_AND_ASSIGN(Stream* side, NewStream("side"));
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Buffer on_side, backend().AllocateDevice(1001, *side));
  ASSERT_OK_AND_ASSIGN(Buffer on_compute,
                       backend().AllocateDevice(4096, compute));
  ASSERT_OK_AND_ASSIGN(Buffer pinned, backend().AllocatePinned(1003));

  EXPECT_FALSE(on_side.empty());
  EXPECT_THAT(on_side.data(), NotNull());
  EXPECT_EQ(on_side.size(), 1001);
  EXPECT_EQ(on_side.space(), MemorySpace::kDevice);
  EXPECT_EQ(on_side.stream(), side);
  EXPECT_EQ(on_side.owner(), &backend());

  EXPECT_THAT(on_compute.data(), NotNull());
  EXPECT_EQ(on_compute.size(), 4096);
  EXPECT_EQ(on_compute.space(), MemorySpace::kDevice);
  EXPECT_EQ(on_compute.stream(), &compute);
  EXPECT_EQ(on_compute.owner(), &backend());

  EXPECT_FALSE(pinned.empty());
  EXPECT_THAT(pinned.data(), NotNull());
  EXPECT_EQ(pinned.size(), 1003);
  EXPECT_EQ(pinned.space(), MemorySpace::kPinnedHost);
  EXPECT_THAT(pinned.stream(), IsNull());
  EXPECT_EQ(pinned.owner(), &backend());

  // Live device allocations do not overlap.
  const auto begin1 = reinterpret_cast<uintptr_t>(on_side.data());
  const auto begin2 = reinterpret_cast<uintptr_t>(on_compute.data());
  EXPECT_TRUE(begin1 + on_side.size() <= begin2 ||
              begin2 + on_compute.size() <= begin1);

  // Pinned memory is host memory: every byte can be written and read back.
  FillPinned(pinned, 141);
  EXPECT_TRUE(HoldsPattern(pinned, 141));
}

// Destroyed handles give their memory back: far more memory goes through
// the loops than a small-capacity backend holds.
TEST_P(BackendConformanceTest, DestroyedBuffersReturnTheirMemory) {
  constexpr int kRounds = 1000;
  Stream& compute = backend().ComputeStream();
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    ASSERT_OK_AND_ASSIGN(Buffer device,
                         backend().AllocateDevice(1 * kMiB, compute));
  }
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    ASSERT_OK_AND_ASSIGN(Buffer pinned, backend().AllocatePinned(1 * kMiB));
  }
  ASSERT_OK(compute.Synchronize());
}

// ---------------------------------------------------------------------------
// Streams.

TEST_P(BackendConformanceTest, StreamsHaveDistinctIdentitiesAndNames) {
  Stream& compute = backend().ComputeStream();
  EXPECT_EQ(compute.name(), "compute");
  EXPECT_EQ(&backend().ComputeStream(), &compute);

  Stream* offload = nullptr;
  {
    // The backend must keep its own copy of the name.
    std::string name = "offload";
    ASSERT_OK_AND_ASSIGN(offload, NewStream(name));
    name.assign("overwritten");
  }
  ASSERT_OK_AND_ASSIGN(Stream* reload, NewStream("reload"));
  ASSERT_OK_AND_ASSIGN(Stream* reload_again, NewStream("reload"));
  ASSERT_THAT(offload, NotNull());
  ASSERT_THAT(reload, NotNull());
  ASSERT_THAT(reload_again, NotNull());
  EXPECT_EQ(offload->name(), "offload");
  EXPECT_EQ(reload->name(), "reload");
  EXPECT_EQ(reload_again->name(), "reload");
  EXPECT_NE(offload, &compute);
  EXPECT_NE(reload, &compute);
  EXPECT_NE(reload_again, &compute);
  EXPECT_NE(offload, reload);
  EXPECT_NE(reload, reload_again);
  EXPECT_NE(offload, reload_again);
  EXPECT_EQ(compute.name(), "compute");

  // Idle streams synchronize at once.
  EXPECT_OK(offload->Synchronize());
  EXPECT_OK(reload->Synchronize());
  EXPECT_OK(reload_again->Synchronize());
}

}  // namespace

}  // namespace offload
