// Tests of the parts of engine/backend.h that are not virtual: the Buffer
// handle and Backend::Free, driven through MockBackend.

#include "engine/backend.h"

#include <string>
#include <utility>

#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/mock_backend.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::_;
using ::testing::AnyNumber;
using ::testing::HasSubstr;
using ::testing::InSequence;
using ::testing::IsNull;
using ::testing::MockFunction;
using ::testing::NiceMock;
using ::testing::Ref;
using ::testing::Return;
using ::testing::StrictMock;

// Every Release the tests do not expect fails them (StrictMock). Buffers
// wrap addresses inside `memory_`; nothing is dereferenced.
class BufferTest : public ::testing::Test {
 protected:
  void* Address(int offset) { return memory_ + offset; }

  // Expects exactly one Release of the given allocation, returning OK.
  void ExpectRelease(void* data, int64_t size, MemorySpace space,
                     Stream* stream) {
    EXPECT_CALL(backend_, Release(data, size, space, stream))
        .WillOnce(Return(OkStatus()));
  }

  char memory_[256] = {};
  NiceMock<MockStream> stream_{"alloc"};
  StrictMock<MockBackend> backend_;
};

void ExpectEmpty(const Buffer& buffer) {
  EXPECT_TRUE(buffer.empty());
  EXPECT_THAT(buffer.data(), IsNull());
  EXPECT_EQ(buffer.size(), 0);
  EXPECT_THAT(buffer.stream(), IsNull());
  EXPECT_THAT(buffer.owner(), IsNull());
}

TEST_F(BufferTest, DefaultBufferIsEmpty) {
  const Buffer buffer;
  ExpectEmpty(buffer);
}

TEST_F(BufferTest, MakeBufferFillsTheHandle) {
  ExpectRelease(Address(0), 64, MemorySpace::kDevice, &stream_);
  const Buffer buffer = backend_.MakeBufferForTest(
      Address(0), 64, MemorySpace::kDevice, &stream_);
  EXPECT_FALSE(buffer.empty());
  EXPECT_EQ(buffer.data(), Address(0));
  EXPECT_EQ(buffer.size(), 64);
  EXPECT_EQ(buffer.space(), MemorySpace::kDevice);
  EXPECT_EQ(buffer.stream(), &stream_);
  EXPECT_EQ(buffer.owner(), &backend_);
}

TEST_F(BufferTest, MoveConstructionTransfersOwnership) {
  MockFunction<void(std::string)> checkpoint;
  {
    InSequence sequence;
    EXPECT_CALL(checkpoint, Call("moved"));
    ExpectRelease(Address(0), 64, MemorySpace::kDevice, &stream_);
  }
  Buffer source = backend_.MakeBufferForTest(Address(0), 64,
                                             MemorySpace::kDevice, &stream_);
  Buffer target(std::move(source));
  ExpectEmpty(source);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(target.data(), Address(0));
  EXPECT_EQ(target.size(), 64);
  EXPECT_EQ(target.space(), MemorySpace::kDevice);
  EXPECT_EQ(target.stream(), &stream_);
  EXPECT_EQ(target.owner(), &backend_);
  checkpoint.Call("moved");
}

TEST_F(BufferTest, MoveAssignmentIntoEmptyTransfersOwnership) {
  MockFunction<void(std::string)> checkpoint;
  {
    InSequence sequence;
    EXPECT_CALL(checkpoint, Call("moved"));
    ExpectRelease(Address(0), 32, MemorySpace::kPinnedHost, nullptr);
  }
  Buffer source = backend_.MakeBufferForTest(Address(0), 32,
                                             MemorySpace::kPinnedHost, nullptr);
  Buffer target;
  target = std::move(source);
  ExpectEmpty(source);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(target.data(), Address(0));
  EXPECT_EQ(target.size(), 32);
  EXPECT_EQ(target.space(), MemorySpace::kPinnedHost);
  EXPECT_THAT(target.stream(), IsNull());
  EXPECT_EQ(target.owner(), &backend_);
  checkpoint.Call("moved");
}

TEST_F(BufferTest, MoveAssignmentReleasesTheOldBufferFirst) {
  MockFunction<void(std::string)> checkpoint;
  {
    InSequence sequence;
    ExpectRelease(Address(0), 16, MemorySpace::kDevice, &stream_);
    EXPECT_CALL(checkpoint, Call("assigned"));
    ExpectRelease(Address(64), 48, MemorySpace::kPinnedHost, nullptr);
  }
  Buffer target = backend_.MakeBufferForTest(Address(0), 16,
                                             MemorySpace::kDevice, &stream_);
  Buffer source = backend_.MakeBufferForTest(Address(64), 48,
                                             MemorySpace::kPinnedHost, nullptr);
  target = std::move(source);
  checkpoint.Call("assigned");
  ExpectEmpty(source);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(target.data(), Address(64));
  EXPECT_EQ(target.size(), 48);
  EXPECT_EQ(target.space(), MemorySpace::kPinnedHost);
  EXPECT_THAT(target.stream(), IsNull());
}

TEST_F(BufferTest, SelfMoveAssignmentKeepsTheBuffer) {
  MockFunction<void(std::string)> checkpoint;
  {
    InSequence sequence;
    EXPECT_CALL(checkpoint, Call("self-assigned"));
    ExpectRelease(Address(0), 8, MemorySpace::kDevice, &stream_);
  }
  Buffer buffer =
      backend_.MakeBufferForTest(Address(0), 8, MemorySpace::kDevice, &stream_);
  Buffer& alias = buffer;
  buffer = std::move(alias);
  checkpoint.Call("self-assigned");
  EXPECT_EQ(buffer.data(), Address(0));
  EXPECT_EQ(buffer.size(), 8);
  EXPECT_EQ(buffer.owner(), &backend_);
}

TEST_F(BufferTest, DestroyingADeviceBufferReleasesItOnceOnItsStream) {
  ExpectRelease(Address(0), 128, MemorySpace::kDevice, &stream_);
  {
    Buffer buffer = backend_.MakeBufferForTest(Address(0), 128,
                                               MemorySpace::kDevice, &stream_);
  }
  ::testing::Mock::VerifyAndClearExpectations(&backend_);
}

TEST_F(BufferTest, DestroyingAPinnedBufferReleasesItAtOnce) {
  ExpectRelease(Address(0), 128, MemorySpace::kPinnedHost, nullptr);
  {
    Buffer buffer = backend_.MakeBufferForTest(
        Address(0), 128, MemorySpace::kPinnedHost, nullptr);
  }
  ::testing::Mock::VerifyAndClearExpectations(&backend_);
}

TEST_F(BufferTest, PinnedMemoryIsReleasedAtOnceEvenIfTheHandleNamesAStream) {
  ExpectRelease(Address(0), 64, MemorySpace::kPinnedHost, nullptr);
  {
    Buffer buffer = backend_.MakeBufferForTest(
        Address(0), 64, MemorySpace::kPinnedHost, &stream_);
  }
  ::testing::Mock::VerifyAndClearExpectations(&backend_);
}

TEST_F(BufferTest, DestroyingAnEmptyBufferReleasesNothing) {
  Buffer buffer =
      backend_.MakeBufferForTest(Address(0), 4, MemorySpace::kDevice, &stream_);
  ExpectRelease(Address(0), 4, MemorySpace::kDevice, &stream_);
  { Buffer taker = std::move(buffer); }
  ::testing::Mock::VerifyAndClearExpectations(&backend_);
  // `buffer` is moved from; its destruction must not call Release (the
  // StrictMock fails the test if it does).
}

TEST_F(BufferTest, FailedReleaseInDestructorIsReported) {
  EXPECT_CALL(backend_, Release(Address(0), 4, MemorySpace::kDevice, &stream_))
      .WillOnce(Return(InternalError("device lost")));
  EXPECT_CALL(backend_, OnReleaseFailed(InternalError("device lost")));
  Buffer buffer =
      backend_.MakeBufferForTest(Address(0), 4, MemorySpace::kDevice, &stream_);
}

TEST(MemorySpaceTest, Names) {
  EXPECT_EQ(MemorySpaceName(MemorySpace::kDevice), "device");
  EXPECT_EQ(MemorySpaceName(MemorySpace::kPinnedHost), "pinned");
}

// Backend::Free, on the same fixture.
using FreeTest = BufferTest;

TEST_F(FreeTest, RejectsAnEmptyBuffer) {
  EXPECT_CALL(backend_, OwnsStream(_))
      .Times(AnyNumber())
      .WillRepeatedly(Return(true));
  Buffer never_allocated;
  EXPECT_THAT(backend_.Free(never_allocated, stream_),
              StatusIs(StatusCode::kInvalidArgument));

  ExpectRelease(Address(0), 4, MemorySpace::kDevice, &stream_);
  Buffer source =
      backend_.MakeBufferForTest(Address(0), 4, MemorySpace::kDevice, &stream_);
  Buffer target = std::move(source);
  EXPECT_THAT(
      backend_.Free(source, stream_),  // NOLINT(bugprone-use-after-move)
      StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(target.empty());
}

TEST_F(FreeTest, RejectsABufferOfAnotherBackend) {
  StrictMock<MockBackend> other;
  EXPECT_CALL(other, OwnsStream(_))
      .Times(AnyNumber())
      .WillRepeatedly(Return(true));
  // The one Release: by the owner, when the handle is destroyed.
  ExpectRelease(Address(0), 64, MemorySpace::kDevice, &stream_);
  Buffer buffer = backend_.MakeBufferForTest(Address(0), 64,
                                             MemorySpace::kDevice, &stream_);

  EXPECT_THAT(other.Free(buffer, stream_),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(buffer.empty());
  EXPECT_EQ(buffer.data(), Address(0));
  EXPECT_EQ(buffer.size(), 64);
  EXPECT_EQ(buffer.space(), MemorySpace::kDevice);
  EXPECT_EQ(buffer.stream(), &stream_);
  EXPECT_EQ(buffer.owner(), &backend_);
}

TEST_F(FreeTest, RejectsAStreamTheBackendDoesNotOwn) {
  NiceMock<MockStream> foreign("foreign-stream");
  EXPECT_CALL(backend_, OwnsStream(Ref(foreign))).WillRepeatedly(Return(false));
  ExpectRelease(Address(0), 64, MemorySpace::kDevice, &stream_);
  Buffer buffer = backend_.MakeBufferForTest(Address(0), 64,
                                             MemorySpace::kDevice, &stream_);

  EXPECT_THAT(
      backend_.Free(buffer, foreign),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("foreign-stream")));
  EXPECT_FALSE(buffer.empty());
  EXPECT_EQ(buffer.data(), Address(0));
  EXPECT_EQ(buffer.size(), 64);
  EXPECT_EQ(buffer.stream(), &stream_);
  EXPECT_EQ(buffer.owner(), &backend_);
}

TEST_F(FreeTest, ReleasesOnTheGivenStreamAndEmptiesTheHandle) {
  NiceMock<MockStream> free_stream("free");
  EXPECT_CALL(backend_, OwnsStream(_)).WillRepeatedly(Return(true));
  MockFunction<void(std::string)> checkpoint;
  {
    InSequence sequence;
    ExpectRelease(Address(0), 64, MemorySpace::kDevice, &free_stream);
    EXPECT_CALL(checkpoint, Call("freed"));
  }
  Buffer buffer = backend_.MakeBufferForTest(Address(0), 64,
                                             MemorySpace::kDevice, &stream_);
  EXPECT_OK(backend_.Free(buffer, free_stream));
  checkpoint.Call("freed");
  ExpectEmpty(buffer);
  // Destroying the emptied handle must not release again (StrictMock).
}

TEST_F(FreeTest, FreeOfPinnedMemoryIsOrderedOnTheGivenStream) {
  NiceMock<MockStream> free_stream("free");
  EXPECT_CALL(backend_, OwnsStream(_)).WillRepeatedly(Return(true));
  ExpectRelease(Address(0), 32, MemorySpace::kPinnedHost, &free_stream);
  Buffer buffer = backend_.MakeBufferForTest(Address(0), 32,
                                             MemorySpace::kPinnedHost, nullptr);
  EXPECT_OK(backend_.Free(buffer, free_stream));
  ExpectEmpty(buffer);
}

TEST_F(FreeTest, FailedReleaseIsReturnedAndLeavesTheBufferUntouched) {
  NiceMock<MockStream> free_stream("free");
  EXPECT_CALL(backend_, OwnsStream(_)).WillRepeatedly(Return(true));
  {
    InSequence sequence;
    EXPECT_CALL(backend_,
                Release(Address(0), 64, MemorySpace::kDevice, &free_stream))
        .WillOnce(Return(ResourceExhaustedError("release queue full")));
    // The handle still owns the memory and returns it when destroyed.
    ExpectRelease(Address(0), 64, MemorySpace::kDevice, &stream_);
  }
  Buffer buffer = backend_.MakeBufferForTest(Address(0), 64,
                                             MemorySpace::kDevice, &stream_);
  EXPECT_EQ(backend_.Free(buffer, free_stream),
            ResourceExhaustedError("release queue full"));
  EXPECT_FALSE(buffer.empty());
  EXPECT_EQ(buffer.data(), Address(0));
  EXPECT_EQ(buffer.size(), 64);
  EXPECT_EQ(buffer.space(), MemorySpace::kDevice);
  EXPECT_EQ(buffer.stream(), &stream_);
  EXPECT_EQ(buffer.owner(), &backend_);
}

// ---------------------------------------------------------------- Gather

std::vector<std::vector<int64_t>> Runs(int64_t element_size,
                                       const std::vector<int64_t>& shape,
                                       const std::vector<int64_t>& strides) {
  std::vector<std::vector<int64_t>> runs;
  ForEachContiguousRun(element_size, shape, strides,
                       [&](int64_t src, int64_t dst, int64_t bytes) {
                         runs.push_back({src, dst, bytes});
                       });
  return runs;
}

TEST(ForEachContiguousRunTest, DenseViewIsOneRun) {
  EXPECT_EQ(Runs(4, {3, 5}, {5, 1}),
            (std::vector<std::vector<int64_t>>{{0, 0, 60}}));
  // Size-1 dimensions fold in whatever their stride.
  EXPECT_EQ(Runs(2, {1, 4, 1}, {99, 1, 7}),
            (std::vector<std::vector<int64_t>>{{0, 0, 8}}));
}

TEST(ForEachContiguousRunTest, RowSliceGivesOneRunPerRow) {
  // x[:, 2:5] of a [2, 8] f32 tensor.
  EXPECT_EQ(Runs(4, {2, 3}, {8, 1}),
            (std::vector<std::vector<int64_t>>{{0, 0, 12}, {32, 12, 12}}));
}

TEST(ForEachContiguousRunTest, StridedLastDimensionGivesOneRunPerElement) {
  // Transpose of a [2, 3] bf16 tensor: shape [3, 2], strides [1, 3].
  EXPECT_EQ(Runs(2, {3, 2}, {1, 3}),
            (std::vector<std::vector<int64_t>>{{0, 0, 2},
                                               {6, 2, 2},
                                               {2, 4, 2},
                                               {8, 6, 2},
                                               {4, 8, 2},
                                               {10, 10, 2}}));
}

TEST(ForEachContiguousRunTest, EmptyViewHasNoRuns) {
  EXPECT_TRUE(Runs(4, {3, 0}, {1, 1}).empty());
}

TEST(StreamGatherTest, DefaultImplementationCopiesEachRun) {
  NiceMock<MockStream> stream("compute");
  char src[64], dst[64];
  {
    InSequence sequence;
    EXPECT_CALL(stream, Copy(dst, src, 12)).WillOnce(Return(OkStatus()));
    EXPECT_CALL(stream, Copy(dst + 12, src + 32, 12))
        .WillOnce(Return(OkStatus()));
  }
  EXPECT_OK(stream.Stream::Gather(dst, src, 4, {2, 3}, {8, 1}));
}

TEST(StreamGatherTest, DefaultImplementationStopsAtTheFirstFailedCopy) {
  NiceMock<MockStream> stream("compute");
  char src[64], dst[64];
  EXPECT_CALL(stream, Copy(_, _, _))
      .WillOnce(Return(InternalError("copy engine on fire")));
  EXPECT_EQ(stream.Stream::Gather(dst, src, 4, {2, 3}, {8, 1}),
            InternalError("copy engine on fire"));
}

TEST(StreamGatherTest, BadArgumentsAreRejectedBeforeAnyCopy) {
  NiceMock<MockStream> stream("compute");
  char src[64], dst[64];
  EXPECT_CALL(stream, Copy(_, _, _)).Times(0);
  EXPECT_THAT(stream.Stream::Gather(dst, src, 0, {2}, {1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("element size")));
  EXPECT_THAT(stream.Stream::Gather(dst, src, 4, {2}, {1, 1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("length")));
  EXPECT_THAT(stream.Stream::Gather(dst, src, 4, {2}, {-1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(stream.Stream::Gather(nullptr, src, 4, {2}, {1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("null")));
}

// A backend that does not override the capture calls says so, by name.
TEST(GraphCaptureTest, BackendWithoutGraphsSaysUnimplemented) {
  NiceMock<MockBackend> backend;
  NiceMock<MockStream> stream{"compute"};
  struct NoExec : GraphExec {} exec;
  EXPECT_FALSE(backend.SupportsGraphs());
  EXPECT_FALSE(backend.IsCapturing(stream));
  EXPECT_THAT(backend.BeginCapture(stream, CaptureMode::kGlobal),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("BeginCapture")));
  EXPECT_THAT(backend.EndCapture(stream).status(),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("EndCapture")));
  EXPECT_THAT(backend.Launch(exec, stream),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("Launch")));
}

TEST(GraphCaptureTest, CaptureModeNames) {
  EXPECT_EQ(CaptureModeName(CaptureMode::kGlobal), "global");
  EXPECT_EQ(CaptureModeName(CaptureMode::kThreadLocal), "thread_local");
  EXPECT_EQ(CaptureModeName(CaptureMode::kRelaxed), "relaxed");
}

}  // namespace
}  // namespace offload
