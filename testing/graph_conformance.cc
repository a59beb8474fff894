// The graph-capture part of the Backend conformance suite
// (GraphConformanceTest, backend_conformance.h): capture, instantiate and
// launch; graph memory; what a capture refuses and that a refused call
// leaves the capture intact. Skipped on backends without SupportsGraphs().

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/backend_conformance.h"
#include "testing/byte_pattern.h"
#include "testing/conformance_bytes.h"
#include "testing/status_matchers.h"

namespace offload {

void GraphConformanceTest::SetUp() {
  BackendConformanceTest::SetUp();
  if (HasFatalFailure()) return;
  if (!backend().SupportsGraphs()) {
    GTEST_SKIP() << "BackendFactory '" << GetParam().name
                 << "': the backend does not support graph capture";
  }
}

void GraphConformanceTest::TearDown() {
  if (!has_backend()) return;
  std::vector<Stream*> all = streams();
  all.push_back(&backend().ComputeStream());
  for (Stream* stream : all) {
    if (backend().IsCapturing(*stream)) {
      (void)backend().EndCapture(*stream);
    }
  }
  BackendConformanceTest::TearDown();
}

namespace {

using ::testing::HasSubstr;
using ::testing::NotNull;
using conformance::FillPinned;
using conformance::HoldsPattern;
using conformance::kKiB;
using conformance::kMiB;
using conformance::PinnedWithPattern;

// ---------------------------------------------------------------------------
// Graph capture (GraphConformanceTest: skipped without SupportsGraphs()).

// Device memory holding pattern `seed`, written by an eager H2D copy on
// `stream` from a pinned buffer that the caller keeps alive (`staging`).
StatusOr<Buffer> DeviceWithPattern(Backend& backend, Stream& stream,
                                   int64_t size, uint64_t seed,
                                   Buffer& staging) {
  OFFLOAD_ASSIGN_OR_RETURN(staging, PinnedWithPattern(backend, size, seed));
  OFFLOAD_ASSIGN_OR_RETURN(Buffer device, backend.AllocateDevice(size, stream));
  OFFLOAD_RETURN_IF_ERROR(stream.Copy(device.data(), staging.data(), size));
  return device;
}

// What CaptureH2DThenSideD2H copies through: pinned `src` (pattern `seed`)
// and `dst` (zeros), a device buffer on the compute stream, and the two
// events that join the side stream and back.
struct SideCopy {
  Buffer src;
  Buffer dst;
  Buffer device;
  std::unique_ptr<Event> written;
  std::unique_ptr<Event> copied;
};

// Makes a SideCopy of `n` bytes; the compute stream is synchronized after.
StatusOr<SideCopy> MakeSideCopy(Backend& backend, int64_t n, uint64_t seed) {
  Stream& compute = backend.ComputeStream();
  SideCopy c;
  OFFLOAD_ASSIGN_OR_RETURN(c.src, PinnedWithPattern(backend, n, seed));
  OFFLOAD_ASSIGN_OR_RETURN(c.dst, PinnedWithPattern(backend, n, 0));
  OFFLOAD_ASSIGN_OR_RETURN(c.device, backend.AllocateDevice(n, compute));
  OFFLOAD_ASSIGN_OR_RETURN(c.written, backend.NewEvent());
  OFFLOAD_ASSIGN_OR_RETURN(c.copied, backend.NewEvent());
  OFFLOAD_RETURN_IF_ERROR(compute.Synchronize());
  return c;
}

// Captures, on `compute`, an H2D copy of c.src into c.device, then a D2H
// copy of c.device into c.dst on `side`, joined through c.written and
// joined back through c.copied when `join_back`.
Status CaptureH2DThenSideD2H(Stream& compute, Stream& side, SideCopy& c,
                             bool join_back) {
  OFFLOAD_RETURN_IF_ERROR(
      compute.Copy(c.device.data(), c.src.data(), c.src.size()));
  OFFLOAD_RETURN_IF_ERROR(compute.Record(*c.written));
  OFFLOAD_RETURN_IF_ERROR(side.Wait(*c.written));
  OFFLOAD_RETURN_IF_ERROR(
      side.Copy(c.dst.data(), c.device.data(), c.dst.size()));
  OFFLOAD_RETURN_IF_ERROR(side.Record(*c.copied));
  if (join_back) OFFLOAD_RETURN_IF_ERROR(compute.Wait(*c.copied));
  return OkStatus();
}

TEST_P(GraphConformanceTest, CapturedSideStreamCopyRunsOnlyWhenLaunched) {
  const int64_t n = 1 * kMiB;
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* d2h, NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(SideCopy c, MakeSideCopy(backend(), n, 201));

  EXPECT_FALSE(backend().IsCapturing(compute));
  ASSERT_OK(backend().BeginCapture(compute, CaptureMode::kGlobal));
  EXPECT_TRUE(backend().IsCapturing(compute));
  ASSERT_OK(CaptureH2DThenSideD2H(compute, *d2h, c, /*join_back=*/true));
  EXPECT_TRUE(backend().IsCapturing(*d2h));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       backend().EndCapture(compute));
  ASSERT_THAT(graph, NotNull());
  EXPECT_FALSE(backend().IsCapturing(compute));
  EXPECT_FALSE(backend().IsCapturing(*d2h));
  ASSERT_OK(compute.Synchronize());
  ASSERT_OK(d2h->Synchronize());
  EXPECT_TRUE(HoldsPattern(c.dst, 0)) << "captured work ran before a launch";

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       backend().Instantiate(*graph));
  ASSERT_THAT(exec, NotNull());
  ASSERT_OK(backend().Launch(*exec, compute));
  ASSERT_OK(compute.Synchronize());  // joined back: covers the side copy
  EXPECT_TRUE(HoldsPattern(c.dst, 201));
  // New bytes in the pinned input, a new launch.
  FillPinned(c.src, 202);
  ASSERT_OK(backend().Launch(*exec, compute));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(c.dst, 202));
}

TEST_P(GraphConformanceTest, LaunchesReadDeviceBytesWrittenBetweenThem) {
  const int64_t n = 1 * kMiB;
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* d2h, NewStream("d2h"));
  Buffer staging;
  ASSERT_OK_AND_ASSIGN(Buffer device, DeviceWithPattern(backend(), compute, n,
                                                        211, staging));
  ASSERT_OK_AND_ASSIGN(Buffer dst, PinnedWithPattern(backend(), n, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> start, backend().NewEvent());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> done, backend().NewEvent());
  ASSERT_OK(compute.Synchronize());
  // Only a D2H copy on the side stream is captured.
  ASSERT_OK(backend().BeginCapture(compute, CaptureMode::kThreadLocal));
  ASSERT_OK(compute.Record(*start));
  ASSERT_OK(d2h->Wait(*start));
  ASSERT_OK(d2h->Copy(dst.data(), device.data(), n));
  ASSERT_OK(d2h->Record(*done));
  ASSERT_OK(compute.Wait(*done));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       backend().EndCapture(compute));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       backend().Instantiate(*graph));
  graph.reset();  // the exec does not need it
  for (uint64_t seed : {uint64_t{212}, uint64_t{213}}) {
    SCOPED_TRACE(seed);
    // An eager H2D write on the launch stream, ordered before the launch.
    FillPinned(staging, seed);
    ASSERT_OK(compute.Copy(device.data(), staging.data(), n));
    ASSERT_OK(backend().Launch(*exec, compute));
    ASSERT_OK(compute.Synchronize());
    EXPECT_TRUE(HoldsPattern(dst, seed));
  }
}

TEST_P(GraphConformanceTest, GraphMemoryIsAllocatedAndFreedByEachLaunch) {
  const int64_t n = 1 * kMiB;
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), n, 221));
  ASSERT_OK_AND_ASSIGN(Buffer dst, PinnedWithPattern(backend(), n, 0));
  ASSERT_OK(backend().BeginCapture(compute, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(Buffer tmp, backend().AllocateDevice(n, compute));
  EXPECT_EQ(tmp.size(), n);
  EXPECT_EQ(tmp.space(), MemorySpace::kDevice);
  ASSERT_OK(compute.Copy(tmp.data(), src.data(), n));
  ASSERT_OK(compute.Copy(dst.data(), tmp.data(), n));
  ASSERT_OK(backend().Free(tmp, compute));
  EXPECT_TRUE(tmp.empty());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       backend().EndCapture(compute));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       backend().Instantiate(*graph));
  for (uint64_t seed : {uint64_t{221}, uint64_t{222}, uint64_t{223}}) {
    SCOPED_TRACE(seed);
    FillPinned(src, seed);
    ASSERT_OK(backend().Launch(*exec, compute));
    ASSERT_OK(compute.Synchronize());
    EXPECT_TRUE(HoldsPattern(dst, seed));
  }
}

TEST_P(GraphConformanceTest, UnjoinedSideStreamFailsEndCaptureAndEndsIt) {
  const int64_t n = 256 * kKiB;
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* d2h, NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(SideCopy c, MakeSideCopy(backend(), n, 231));
  ASSERT_OK(backend().BeginCapture(compute, CaptureMode::kGlobal));
  ASSERT_OK(CaptureH2DThenSideD2H(compute, *d2h, c, /*join_back=*/false));
  EXPECT_THAT(backend().EndCapture(compute),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_FALSE(backend().IsCapturing(compute));
  EXPECT_FALSE(backend().IsCapturing(*d2h));
  ASSERT_OK(compute.Synchronize());
  ASSERT_OK(d2h->Synchronize());
  EXPECT_TRUE(HoldsPattern(c.dst, 0)) << "work of a failed capture ran";
  // Both streams work eagerly again, and a new capture works.
  ASSERT_OK(compute.Copy(c.device.data(), c.src.data(), n));
  ASSERT_OK(compute.Synchronize());
  ASSERT_OK(backend().BeginCapture(compute, CaptureMode::kGlobal));
  ASSERT_OK(compute.Copy(c.dst.data(), c.device.data(), n));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       backend().EndCapture(compute));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       backend().Instantiate(*graph));
  ASSERT_OK(backend().Launch(*exec, compute));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(c.dst, 231));
}

// What RefusedCallsLeaveTheCaptureIntact captures on `compute`, its origin:
// an H2D copy of c.src into c.device; `side` joins through c.written,
// allocates graph memory, copies c.device into it and it into c.dst and
// records c.copied; `compute` waits for c.copied and frees the graph memory.
// `during(graph_memory)`, when set, runs before that wait: with `side`
// joined, the graph memory live, and both events recorded in the capture.
Status CaptureThroughGraphMemory(
    Backend& backend, Stream& compute, Stream& side, SideCopy& c,
    const std::function<void(Buffer& graph_memory)>& during) {
  const int64_t n = c.src.size();
  OFFLOAD_RETURN_IF_ERROR(compute.Copy(c.device.data(), c.src.data(), n));
  OFFLOAD_RETURN_IF_ERROR(compute.Record(*c.written));
  OFFLOAD_RETURN_IF_ERROR(side.Wait(*c.written));
  OFFLOAD_ASSIGN_OR_RETURN(Buffer graph_memory,
                           backend.AllocateDevice(n, side));
  OFFLOAD_RETURN_IF_ERROR(side.Copy(graph_memory.data(), c.device.data(), n));
  OFFLOAD_RETURN_IF_ERROR(side.Copy(c.dst.data(), graph_memory.data(), n));
  OFFLOAD_RETURN_IF_ERROR(side.Record(*c.copied));
  if (during) during(graph_memory);
  OFFLOAD_RETURN_IF_ERROR(compute.Wait(*c.copied));
  return backend.Free(graph_memory, compute);
}

// What RefusedCallsLeaveTheCaptureIntact prepares outside its captures.
struct RefusalRig {
  SideCopy c;                             // CaptureThroughGraphMemory's
  Buffer spare;                           // pinned, pattern 0
  std::unique_ptr<Event> outside;         // recorded on `other`
  std::unique_ptr<GraphExec> other_exec;  // copies c.src into spare
};

// Makes a RefusalRig of `n` bytes (c.src holds pattern `seed`); other_exec
// is captured on `other`.
StatusOr<RefusalRig> MakeRefusalRig(Backend& backend, Stream& other, int64_t n,
                                    uint64_t seed) {
  RefusalRig rig;
  OFFLOAD_ASSIGN_OR_RETURN(rig.c, MakeSideCopy(backend, n, seed));
  OFFLOAD_ASSIGN_OR_RETURN(rig.spare, PinnedWithPattern(backend, n, 0));
  OFFLOAD_ASSIGN_OR_RETURN(rig.outside, backend.NewEvent());
  OFFLOAD_RETURN_IF_ERROR(other.Record(*rig.outside));
  OFFLOAD_RETURN_IF_ERROR(backend.BeginCapture(other, CaptureMode::kGlobal));
  OFFLOAD_RETURN_IF_ERROR(other.Copy(rig.spare.data(), rig.c.src.data(), n));
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph,
                           backend.EndCapture(other));
  OFFLOAD_ASSIGN_OR_RETURN(rig.other_exec, backend.Instantiate(*graph));
  return rig;
}

// The calls of engine/backend.h's list, made in the middle of the capture of
// the compute stream that `d2h` joined (CaptureThroughGraphMemory's
// `during`; `other` is not part of it): each is kFailedPrecondition, says
// why, and leaves its buffers as they were.
void ExpectRefusedInCapture(Backend& backend, Stream& d2h, Stream& other,
                            CaptureMode mode, RefusalRig& rig,
                            Buffer& graph_memory) {
  Stream& compute = backend.ComputeStream();
  const StatusCode refused = StatusCode::kFailedPrecondition;
  const int64_t n = graph_memory.size();
  // The host cannot wait for captured work.
  EXPECT_THAT(compute.Synchronize(),
              StatusIs(refused, HasSubstr("stream 'compute'")));
  EXPECT_THAT(d2h.Synchronize(), StatusIs(refused));
  EXPECT_THAT(rig.c.written->Query(),
              StatusIs(refused, HasSubstr("on stream 'compute'")));
  EXPECT_THAT(rig.c.written->Synchronize(), StatusIs(refused));
  EXPECT_THAT(rig.c.copied->Query(),
              StatusIs(refused, HasSubstr("on stream 'd2h'")));
  EXPECT_THAT(rig.c.copied->Synchronize(), StatusIs(refused));
  // Pinned memory, also on a stream that is not capturing.
  EXPECT_THAT(backend.AllocatePinned(n),
              StatusIs(refused, HasSubstr("AllocatePinned")));
  EXPECT_THAT(backend.Free(rig.spare, compute),
              StatusIs(refused, HasSubstr("pinned")));
  EXPECT_THAT(backend.Free(rig.spare, other),
              StatusIs(refused, HasSubstr("pinned")));
  EXPECT_FALSE(rig.spare.empty());
  // Only in-stream order crosses the capture's boundary, and device memory
  // does not: memory from outside is not freed in it, graph memory is not
  // freed or read outside it.
  EXPECT_THAT(compute.Wait(*rig.outside),
              StatusIs(refused, HasSubstr("outside the capture")));
  EXPECT_THAT(d2h.Wait(*rig.outside),
              StatusIs(refused, HasSubstr("outside the capture")));
  EXPECT_THAT(backend.Free(rig.c.device, compute),
              StatusIs(refused, HasSubstr("allocated outside")));
  EXPECT_FALSE(rig.c.device.empty());
  EXPECT_THAT(backend.Free(graph_memory, other),
              StatusIs(refused, HasSubstr("graph memory")));
  EXPECT_FALSE(graph_memory.empty());
  // (Refused with kInvalidArgument by the simulator, kFailedPrecondition by
  // CUDA: the interface does not say which.)
  EXPECT_FALSE(other.Copy(rig.spare.data(), graph_memory.data(), n).ok());
  // Launches, captures and ends on streams of the capture.
  EXPECT_THAT(backend.Launch(*rig.other_exec, compute), StatusIs(refused));
  EXPECT_THAT(backend.Launch(*rig.other_exec, d2h), StatusIs(refused));
  EXPECT_THAT(backend.BeginCapture(compute, mode),
              StatusIs(refused, HasSubstr("already")));
  EXPECT_THAT(backend.BeginCapture(d2h, mode),
              StatusIs(refused, HasSubstr("already")));
  EXPECT_THAT(backend.EndCapture(d2h), StatusIs(refused, HasSubstr("origin")));
}

// Allowed in the same place: a new event, never recorded, is complete and a
// Wait for it is a no-op; a record on a stream outside the capture. The
// capture goes on.
void ExpectAllowedInCapture(Backend& backend, Stream& d2h, Stream& other) {
  Stream& compute = backend.ComputeStream();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> fresh, backend.NewEvent());
  EXPECT_THAT(fresh->Query(), IsOkAndHolds(true));
  EXPECT_OK(fresh->Synchronize());
  EXPECT_OK(compute.Wait(*fresh));
  EXPECT_OK(other.Record(*fresh));
  EXPECT_TRUE(backend.IsCapturing(compute));
  EXPECT_TRUE(backend.IsCapturing(d2h));
  EXPECT_FALSE(backend.IsCapturing(other));
}

// Once the capture has ended: its events are refused until recorded again
// (their work never ran), and what it refused works (other_exec copies
// pattern `seed`).
void ExpectRefusedCallsWorkAfterTheCapture(Backend& backend, Stream& other,
                                           RefusalRig& rig, uint64_t seed) {
  Stream& compute = backend.ComputeStream();
  const StatusCode refused = StatusCode::kFailedPrecondition;
  EXPECT_THAT(rig.c.written->Query(), StatusIs(refused, HasSubstr("ended")));
  EXPECT_THAT(rig.c.written->Synchronize(),
              StatusIs(refused, HasSubstr("never ran")));
  EXPECT_THAT(other.Wait(*rig.c.copied), StatusIs(refused, HasSubstr("ended")));
  ASSERT_OK(compute.Record(*rig.c.written));
  EXPECT_OK(rig.c.written->Synchronize());
  EXPECT_THAT(rig.c.written->Query(), IsOkAndHolds(true));
  FillPinned(rig.c.src, seed);
  EXPECT_OK(backend.Launch(*rig.other_exec, compute));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(rig.spare, seed));
  EXPECT_OK(backend.AllocatePinned(rig.spare.size()).status());
  EXPECT_OK(backend.Free(rig.spare, compute));
  EXPECT_OK(backend.Free(rig.c.device, other));
}

// Every call engine/backend.h refuses during a capture, in the middle of one
// in kGlobal and in kThreadLocal mode (both restrict the capturing thread):
// refused with a reason, changing nothing (the buffers stay, the graph has
// as many operations as the same capture without them, its launches copy
// the bytes of their time), and working once the capture has ended.
TEST_P(GraphConformanceTest, RefusedCallsLeaveTheCaptureIntact) {
  const int64_t n = 256 * kKiB;
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* d2h, NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(Stream* other, NewStream("other"));
  uint64_t seed = 240;
  for (CaptureMode mode : {CaptureMode::kGlobal, CaptureMode::kThreadLocal}) {
    SCOPED_TRACE(std::string(CaptureModeName(mode)) + " mode");
    seed += 10;
    ASSERT_OK_AND_ASSIGN(RefusalRig rig,
                         MakeRefusalRig(backend(), *other, n, seed));
    ASSERT_OK(backend().BeginCapture(compute, mode));
    ASSERT_OK(
        CaptureThroughGraphMemory(backend(), compute, *d2h, rig.c, nullptr));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> plain,
                         backend().EndCapture(compute));

    ASSERT_OK(backend().BeginCapture(compute, mode));
    ASSERT_OK(CaptureThroughGraphMemory(
        backend(), compute, *d2h, rig.c, [&](Buffer& graph_memory) {
          ExpectRefusedInCapture(backend(), *d2h, *other, mode, rig,
                                 graph_memory);
          ExpectAllowedInCapture(backend(), *d2h, *other);
        }));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                         backend().EndCapture(compute));
    EXPECT_EQ(graph->size(), plain->size());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                         backend().Instantiate(*graph));
    for (uint64_t launch : {seed + 1, seed + 2, seed + 3}) {
      SCOPED_TRACE(launch);
      FillPinned(rig.c.src, launch);
      ASSERT_OK(backend().Launch(*exec, compute));
      ASSERT_OK(compute.Synchronize());
      EXPECT_TRUE(HoldsPattern(rig.c.dst, launch));
    }
    ASSERT_NO_FATAL_FAILURE(
        ExpectRefusedCallsWorkAfterTheCapture(backend(), *other, rig, seed));
  }
}

// Launch on a stream that captures is refused and records nothing: the
// capture goes on (a graph and an exec dropped meanwhile do not disturb it)
// and ends empty; on a stream that is not capturing the exec launches.
TEST_P(GraphConformanceTest, LaunchOnACapturingStreamIsRefused) {
  Stream& compute = backend().ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* side, NewStream("side"));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedWithPattern(backend(), 4096, 251));
  ASSERT_OK_AND_ASSIGN(Buffer dst, PinnedWithPattern(backend(), 4096, 0));
  ASSERT_OK(backend().BeginCapture(*side, CaptureMode::kGlobal));
  ASSERT_OK(side->Copy(dst.data(), src.data(), 4096));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       backend().EndCapture(*side));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> exec,
                       backend().Instantiate(*graph));
  uint64_t seed = 250;
  for (CaptureMode mode : {CaptureMode::kGlobal, CaptureMode::kThreadLocal}) {
    SCOPED_TRACE(std::string(CaptureModeName(mode)) + " mode");
    ASSERT_OK(backend().BeginCapture(*side, mode));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> dropped,
                         backend().EndCapture(*side));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GraphExec> dropped_exec,
                         backend().Instantiate(*dropped));
    FillPinned(dst, 0);
    ASSERT_OK(backend().BeginCapture(compute, mode));
    EXPECT_THAT(backend().Launch(*exec, compute),
                StatusIs(StatusCode::kFailedPrecondition));
    dropped_exec.reset();
    dropped.reset();
    EXPECT_TRUE(backend().IsCapturing(compute));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> empty,
                         backend().EndCapture(compute));
    EXPECT_EQ(empty->size(), 0);
    ASSERT_OK(compute.Synchronize());
    EXPECT_TRUE(HoldsPattern(dst, 0));
    // On a stream that is not capturing, the same exec launches.
    for (int launch = 0; launch < 3; ++launch) {
      FillPinned(src, ++seed);
      ASSERT_OK(backend().Launch(*exec, compute));
      ASSERT_OK(compute.Synchronize());
      EXPECT_TRUE(HoldsPattern(dst, seed));
    }
  }
}

}  // namespace

// Binaries that link the suite for BackendConformanceTest only.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GraphConformanceTest);

}  // namespace offload
