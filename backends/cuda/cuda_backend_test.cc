// CUDA-specific behaviour of CudaBackend, beyond the conformance suite:
// streams are non-blocking and independent of each other (a copy stream
// progresses while another is held), pinned and device memory are pooled so
// that a repeated workload allocates nothing new after its first iteration,
// stream-ordered pinned frees are reused only once the stream passed them,
// and errors carry the CUDA call and message.
//
// Streams are held with a host function that blocks until the test opens its
// gate (cudaLaunchHostFunc), so the ordering checks need no timing; those
// tests are in CudaBackendHeldStreamTest. Tests that make CUDA calls fail on
// purpose are in CudaBackendErrorTest, so that compute-sanitizer can run the
// rest with API error reporting on.

#include "backends/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::Ne;

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;

#define ASSERT_CUDA(expr)                                      \
  do {                                                         \
    cudaError_t cuda_status_ = (expr);                         \
    ASSERT_EQ(cuda_status_, cudaSuccess)                       \
        << #expr << ": " << cudaGetErrorString(cuda_status_);  \
  } while (false)

std::unique_ptr<CudaBackend> MakeBackend(const CudaOptions& options = {}) {
  StatusOr<std::unique_ptr<CudaBackend>> backend = NewCudaBackend(options);
  EXPECT_OK(backend.status());
  return backend.ok() ? std::move(backend).value() : nullptr;
}

// Holds a CUDA stream: work enqueued after Close() waits until Open(). The
// destructor opens the gate and waits for the stream, so the host function
// never outlives the gate.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() {
    Open();
    if (stream_set_) (void)cudaStreamSynchronize(stream_);
  }

  cudaError_t Close(cudaStream_t stream) {
    stream_ = stream;
    stream_set_ = true;
    return cudaLaunchHostFunc(stream, &Gate::Block, this);
  }
  void Open() { open_.store(true); }

 private:
  static void CUDART_CB Block(void* self) {
    auto* gate = static_cast<Gate*>(self);
    while (!gate->open_.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::atomic<bool> open_{false};
  cudaStream_t stream_ = nullptr;
  bool stream_set_ = false;
};

StatusOr<Buffer> PinnedPattern(Backend& backend, int64_t bytes,
                               uint64_t seed) {
  OFFLOAD_ASSIGN_OR_RETURN(Buffer pinned, backend.AllocatePinned(bytes));
  FillPattern(pinned.data(), bytes, seed);
  return pinned;
}

::testing::AssertionResult HoldsPattern(const Buffer& pinned, uint64_t seed) {
  const std::vector<uint8_t> expected = PatternBytes(0, pinned.size(), seed);
  return BytesEqual(
      std::span<const uint8_t>(static_cast<const uint8_t*>(pinned.data()),
                               static_cast<size_t>(pinned.size())),
      expected);
}

// ---------------------------------------------------------------------------
// Streams and events.

TEST(CudaBackendTest, StreamsAreNonBlocking) {
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(Stream* side, backend->NewStream("side"));
  for (Stream* stream : {&backend->ComputeStream(), side}) {
    ASSERT_OK_AND_ASSIGN(cudaStream_t native, backend->NativeStream(*stream));
    unsigned int flags = 0;
    ASSERT_CUDA(cudaStreamGetFlags(native, &flags));
    EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking)
        << stream->name();
  }
  EXPECT_EQ(backend->ComputeStream().name(), "compute");
}

TEST(CudaBackendTest, NativeStreamRejectsForeignStreams) {
  std::unique_ptr<CudaBackend> a = MakeBackend();
  std::unique_ptr<CudaBackend> b = MakeBackend();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(a->NativeStream(b->ComputeStream()),
              StatusIs(StatusCode::kInvalidArgument));
}

// With CudaOptions::compute_stream the compute stream is the caller's, and
// it survives the backend.
TEST(CudaBackendTest, ComputeStreamCanWrapACallersStream) {
  cudaStream_t mine = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  {
    CudaOptions options;
    options.compute_stream = mine;
    std::unique_ptr<CudaBackend> backend = MakeBackend(options);
    ASSERT_NE(backend, nullptr);
    Stream& compute = backend->ComputeStream();
    EXPECT_EQ(compute.name(), "compute");
    EXPECT_THAT(backend->NativeStream(compute), IsOkAndHolds(mine));
    ASSERT_OK_AND_ASSIGN(Buffer src, PinnedPattern(*backend, 64 * kKiB, 5));
    ASSERT_OK_AND_ASSIGN(Buffer device,
                         backend->AllocateDevice(64 * kKiB, compute));
    ASSERT_OK_AND_ASSIGN(Buffer dst, backend->AllocatePinned(64 * kKiB));
    ASSERT_OK(compute.Copy(device.data(), src.data(), 64 * kKiB));
    ASSERT_OK(compute.Copy(dst.data(), device.data(), 64 * kKiB));
    ASSERT_CUDA(cudaStreamSynchronize(mine));
    EXPECT_TRUE(HoldsPattern(dst, 5));
  }
  EXPECT_EQ(cudaStreamQuery(mine), cudaSuccess);
  ASSERT_CUDA(cudaStreamDestroy(mine));
}

// A framework's allocator (CudaOptions::device_allocator) serves every
// device allocation and free, with the stream each is ordered on; the
// backend's pool serves none.
class RecordingAllocator final : public CudaDeviceAllocator {
 public:
  StatusOr<void*> Allocate(int64_t bytes, cudaStream_t stream) override {
    void* data = nullptr;
    if (cudaMallocAsync(&data, static_cast<size_t>(bytes), stream) !=
        cudaSuccess) {
      return ResourceExhaustedError("RecordingAllocator");
    }
    allocations.push_back({data, stream});
    return data;
  }
  Status Free(void* data, cudaStream_t stream) override {
    if (cudaFreeAsync(data, stream) != cudaSuccess) {
      return InternalError("RecordingAllocator: cudaFreeAsync");
    }
    frees.push_back({data, stream});
    return OkStatus();
  }
  std::vector<std::pair<void*, cudaStream_t>> allocations, frees;
};

TEST(CudaBackendTest, DeviceMemoryCanComeFromACallersAllocator) {
  RecordingAllocator allocator;
  CudaOptions options;
  options.device_allocator = &allocator;
  std::unique_ptr<CudaBackend> backend = MakeBackend(options);
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream * copy, backend->NewStream("copy"));
  ASSERT_OK_AND_ASSIGN(cudaStream_t native_compute,
                       backend->NativeStream(compute));
  ASSERT_OK_AND_ASSIGN(cudaStream_t native_copy, backend->NativeStream(*copy));
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedPattern(*backend, 64 * kKiB, 9));
  ASSERT_OK_AND_ASSIGN(Buffer dst, backend->AllocatePinned(64 * kKiB));
  {
    ASSERT_OK_AND_ASSIGN(Buffer device,
                         backend->AllocateDevice(64 * kKiB, compute));
    ASSERT_EQ(allocator.allocations.size(), 1u);
    EXPECT_EQ(allocator.allocations[0].first, device.data());
    EXPECT_EQ(allocator.allocations[0].second, native_compute);
    ASSERT_OK(compute.Copy(device.data(), src.data(), 64 * kKiB));
    ASSERT_OK(compute.Copy(dst.data(), device.data(), 64 * kKiB));
    ASSERT_OK(backend->Free(device, *copy));
    ASSERT_EQ(allocator.frees.size(), 1u);
    EXPECT_EQ(allocator.frees[0].second, native_copy);
  }
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 9));
  ASSERT_OK_AND_ASSIGN(CudaBackendStats stats, backend->stats());
  EXPECT_EQ(stats.device_allocations, 1);
  EXPECT_EQ(stats.device_bytes_in_use, 0);
  EXPECT_EQ(stats.device_pool_used_bytes, 0u);
}

// A D2H copy on one stream and an H2D copy on another do not wait for each
// other: with either stream held, the other one completes its copy.
TEST(CudaBackendHeldStreamTest, D2HAndH2DOnSeparateStreamsBothProgress) {
  const int64_t n = 16 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(Stream* d2h, backend->NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(Stream* h2d, backend->NewStream("h2d"));
  ASSERT_OK_AND_ASSIGN(cudaStream_t d2h_native, backend->NativeStream(*d2h));
  ASSERT_OK_AND_ASSIGN(cudaStream_t h2d_native, backend->NativeStream(*h2d));
  Stream& compute = backend->ComputeStream();

  ASSERT_OK_AND_ASSIGN(Buffer src_a, PinnedPattern(*backend, n, 11));
  ASSERT_OK_AND_ASSIGN(Buffer src_b, PinnedPattern(*backend, n, 12));
  ASSERT_OK_AND_ASSIGN(Buffer out_a, backend->AllocatePinned(n));
  ASSERT_OK_AND_ASSIGN(Buffer out_b, backend->AllocatePinned(n));
  ASSERT_OK_AND_ASSIGN(Buffer dev_a, backend->AllocateDevice(n, compute));
  ASSERT_OK_AND_ASSIGN(Buffer dev_b, backend->AllocateDevice(n, compute));
  ASSERT_OK(compute.Copy(dev_a.data(), src_a.data(), n));
  ASSERT_OK(compute.Synchronize());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> d2h_done, backend->NewEvent());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> h2d_done, backend->NewEvent());

  {
    SCOPED_TRACE("d2h held, h2d runs");
    Gate gate;
    ASSERT_CUDA(gate.Close(d2h_native));
    ASSERT_OK(d2h->Copy(out_a.data(), dev_a.data(), n));
    ASSERT_OK(d2h->Record(*d2h_done));
    ASSERT_OK(h2d->Copy(dev_b.data(), src_b.data(), n));
    ASSERT_OK(h2d->Synchronize());  // would hang if h2d waited for d2h
    EXPECT_THAT(d2h_done->Query(), IsOkAndHolds(false));
    gate.Open();
    ASSERT_OK(d2h->Synchronize());
    EXPECT_THAT(d2h_done->Query(), IsOkAndHolds(true));
  }
  {
    SCOPED_TRACE("h2d held, d2h runs");
    Gate gate;
    ASSERT_CUDA(gate.Close(h2d_native));
    ASSERT_OK(h2d->Copy(dev_a.data(), src_b.data(), n));
    ASSERT_OK(h2d->Record(*h2d_done));
    ASSERT_OK(d2h->Copy(out_b.data(), dev_b.data(), n));
    ASSERT_OK(d2h->Synchronize());  // would hang if d2h waited for h2d
    EXPECT_THAT(h2d_done->Query(), IsOkAndHolds(false));
    gate.Open();
    ASSERT_OK(h2d->Synchronize());
  }
  EXPECT_TRUE(HoldsPattern(out_a, 11));
  EXPECT_TRUE(HoldsPattern(out_b, 12));

  // Both directions at once, many copies each, no gate.
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK(d2h->Copy(out_a.data(), dev_b.data(), n));
    ASSERT_OK(h2d->Copy(dev_a.data(), src_a.data(), n));
  }
  ASSERT_OK(d2h->Synchronize());
  ASSERT_OK(h2d->Synchronize());
  ASSERT_OK(compute.Copy(out_b.data(), dev_a.data(), n));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(out_a, 12));
  EXPECT_TRUE(HoldsPattern(out_b, 11));
}

// Non-blocking streams do not synchronize with the legacy default stream:
// with it held, copies on the backend's streams complete.
TEST(CudaBackendHeldStreamTest, StreamsIgnoreTheLegacyDefaultStream) {
  const int64_t n = 1 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedPattern(*backend, n, 21));
  ASSERT_OK_AND_ASSIGN(Buffer dst, backend->AllocatePinned(n));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend->AllocateDevice(n, compute));
  ASSERT_OK(compute.Synchronize());
  Gate gate;
  ASSERT_CUDA(gate.Close(cudaStreamLegacy));
  ASSERT_OK(compute.Copy(device.data(), src.data(), n));
  ASSERT_OK(compute.Copy(dst.data(), device.data(), n));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 21));
  gate.Open();
}

TEST(CudaBackendTest, CopyRejectsOverlapAndMemoryOfNoAllocation) {
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  ASSERT_OK_AND_ASSIGN(Buffer pinned, backend->AllocatePinned(4096));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend->AllocateDevice(4096, compute));
  char* p = static_cast<char*>(pinned.data());
  EXPECT_THAT(compute.Copy(p + 100, p, 1000),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlap")));
  std::vector<char> pageable(4096);
  EXPECT_THAT(compute.Copy(device.data(), pageable.data(), 4096),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("not inside one live")));
  // One byte past the end of an allocation.
  EXPECT_THAT(compute.Copy(device.data(), pinned.data(), 4097),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("4097")));
  EXPECT_OK(compute.Copy(device.data(), p + 96, 4000));
  ASSERT_OK(compute.Synchronize());
}

// NewEvent hands out a destroyed event's CUDA event again once that event
// completed (then it behaves as never recorded); a pending one is not reused.
TEST(CudaBackendHeldStreamTest, NewEventReusesDestroyedEventsOnceComplete) {
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(Stream* stream, backend->NewStream("copy"));
  ASSERT_OK_AND_ASSIGN(cudaStream_t native, backend->NativeStream(*stream));
  ASSERT_OK_AND_ASSIGN(CudaBackendStats start, backend->stats());
  {
    Gate gate;
    ASSERT_CUDA(gate.Close(native));
    {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> pending, backend->NewEvent());
      ASSERT_OK(stream->Record(*pending));
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> fresh, backend->NewEvent());
    EXPECT_THAT(fresh->Query(), IsOkAndHolds(true));  // not the pending one
    ASSERT_OK_AND_ASSIGN(CudaBackendStats held, backend->stats());
    EXPECT_EQ(held.events_created, start.events_created + 2);
    gate.Open();
  }
  ASSERT_OK(stream->Synchronize());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> reused, backend->NewEvent());
  EXPECT_THAT(reused->Query(), IsOkAndHolds(true));
  ASSERT_OK(backend->ComputeStream().Wait(*reused));
  ASSERT_OK_AND_ASSIGN(CudaBackendStats after, backend->stats());
  EXPECT_EQ(after.events_created, start.events_created + 2);
  EXPECT_EQ(after.events_reused, 1);
}

// ---------------------------------------------------------------------------
// Pinned pool.

TEST(CudaBackendTest, DroppedPinnedBufferIsReusedAtOnce) {
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  void* first = nullptr;
  {
    ASSERT_OK_AND_ASSIGN(Buffer a, backend->AllocatePinned(3 * kMiB + 1));
    first = a.data();
  }
  ASSERT_OK_AND_ASSIGN(Buffer b, backend->AllocatePinned(3 * kMiB + 1));
  EXPECT_EQ(b.data(), first);
  ASSERT_OK_AND_ASSIGN(CudaBackendStats stats, backend->stats());
  EXPECT_EQ(stats.pinned_slab_allocations, 1);
  EXPECT_EQ(stats.pinned_allocations, 2);
}

// Free(pinned, stream) hands the memory out again only once the stream has
// passed the free; until then a new allocation gets other memory (from the
// same slab: no new slab is needed).
TEST(CudaBackendHeldStreamTest, PinnedFreeIsReusedOnlyAfterTheStreamPassedIt) {
  const int64_t n = 1 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(Stream* stream, backend->NewStream("h2d"));
  ASSERT_OK_AND_ASSIGN(cudaStream_t native, backend->NativeStream(*stream));
  ASSERT_OK_AND_ASSIGN(Buffer a, PinnedPattern(*backend, n, 31));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend->AllocateDevice(n, *stream));
  ASSERT_OK_AND_ASSIGN(Buffer check, backend->AllocatePinned(n));
  ASSERT_OK(stream->Synchronize());
  void* const a_data = a.data();
  {
    Gate gate;
    ASSERT_CUDA(gate.Close(native));
    ASSERT_OK(stream->Copy(device.data(), a.data(), n));
    ASSERT_OK(backend->Free(a, *stream));
    ASSERT_OK_AND_ASSIGN(CudaBackendStats held, backend->stats());
    EXPECT_EQ(held.pinned_pending_frees, 1);
    ASSERT_OK_AND_ASSIGN(Buffer b, PinnedPattern(*backend, n, 32));
    EXPECT_THAT(b.data(), Ne(a_data));
    gate.Open();
    ASSERT_OK(stream->Copy(check.data(), device.data(), n));
    ASSERT_OK(stream->Synchronize());
    EXPECT_TRUE(HoldsPattern(check, 31)) << "the freed source was reused";
  }
  ASSERT_OK_AND_ASSIGN(Buffer c, backend->AllocatePinned(n));
  EXPECT_EQ(c.data(), a_data);
  ASSERT_OK_AND_ASSIGN(CudaBackendStats stats, backend->stats());
  EXPECT_EQ(stats.pinned_slab_allocations, 1);
  EXPECT_EQ(stats.pinned_pending_frees, 0);
}

TEST(CudaBackendTest, PinnedCapacityIsEnforcedAndPendingFreesAreWaitedFor) {
  CudaOptions options;
  options.pinned_slab_bytes = 1 * kMiB;
  options.pinned_capacity_bytes = 4 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(Stream* stream, backend->NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend->AllocateDevice(3 * kMiB,
                                                              *stream));
  {
    ASSERT_OK_AND_ASSIGN(Buffer big, backend->AllocatePinned(3 * kMiB));
    EXPECT_THAT(backend->AllocatePinned(2 * kMiB),
                StatusIs(StatusCode::kResourceExhausted,
                         HasSubstr(std::to_string(2 * kMiB))));
    EXPECT_THAT(backend->AllocatePinned(5 * kMiB),
                StatusIs(StatusCode::kResourceExhausted,
                         HasSubstr("capacity")));
    // Freed on a stream with work queued: the next allocation at capacity
    // waits for that free rather than failing.
    ASSERT_OK(stream->Copy(big.data(), device.data(), 3 * kMiB));
    ASSERT_OK(backend->Free(big, *stream));
  }
  ASSERT_OK_AND_ASSIGN(Buffer again, backend->AllocatePinned(3 * kMiB));
  ASSERT_OK_AND_ASSIGN(Buffer rest, backend->AllocatePinned(1 * kMiB));
  ASSERT_OK_AND_ASSIGN(CudaBackendStats stats, backend->stats());
  EXPECT_LE(stats.pinned_slab_bytes, 4 * kMiB);
}

// ---------------------------------------------------------------------------
// Device pool.

TEST(CudaBackendTest, DevicePoolKeepsFreedMemoryUntilTrimmed) {
  const int64_t n = 64 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  {
    ASSERT_OK_AND_ASSIGN(Buffer a, backend->AllocateDevice(n, compute));
  }
  ASSERT_OK(compute.Synchronize());
  ASSERT_OK_AND_ASSIGN(CudaBackendStats kept, backend->stats());
  EXPECT_GE(kept.device_pool_reserved_bytes, static_cast<uint64_t>(n));
  EXPECT_EQ(kept.device_pool_used_bytes, 0u);
  EXPECT_EQ(kept.device_bytes_in_use, 0);
  {
    ASSERT_OK_AND_ASSIGN(Buffer b, backend->AllocateDevice(n, compute));
    ASSERT_OK_AND_ASSIGN(CudaBackendStats reused, backend->stats());
    EXPECT_EQ(reused.device_pool_reserved_high, kept.device_pool_reserved_high);
    EXPECT_EQ(reused.device_bytes_in_use, n);
  }
  ASSERT_OK(backend->Trim());
  ASSERT_OK_AND_ASSIGN(CudaBackendStats trimmed, backend->stats());
  EXPECT_EQ(trimmed.device_pool_reserved_bytes, 0u);
}

// The probe for the byte budget (SPEC §4.7): bytes handed out by
// AllocateDevice and not freed, in host order, with a high-water mark of
// its own.
TEST(CudaBackendTest, InUseProbeCountsDeviceAllocationsAndTheirPeak) {
  const int64_t n = 4 * kMiB;
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  DeviceBytesProbe& probe = backend->InUseProbe();
  EXPECT_EQ(probe.InUseBytes(), 0);
  probe.TakePeakBytes();
  {
    ASSERT_OK_AND_ASSIGN(Buffer a, backend->AllocateDevice(n, compute));
    ASSERT_OK_AND_ASSIGN(Buffer b, backend->AllocateDevice(2 * n, compute));
    EXPECT_EQ(probe.InUseBytes(), 3 * n);
  }
  EXPECT_EQ(probe.InUseBytes(), 0);  // freed in host order
  EXPECT_EQ(probe.TakePeakBytes(), 3 * n);
  EXPECT_EQ(probe.TakePeakBytes(), 0);
  ASSERT_OK(compute.Synchronize());
}

// An engine-shaped iteration: per layer, activations are written on the
// compute stream, offloaded on "d2h" into fresh pinned buffers, and freed on
// compute once the offload is done; in backward they are reloaded on "h2d"
// into fresh device buffers, the pinned copies are freed on "h2d", and the
// compute stream reads the reloaded bytes into a check buffer. After warm-up
// iterations nothing new is reserved: no pinned slab, no device pool growth,
// no event. (Every free is ordered so that what is reused does not depend on
// timing: device memory is freed on the stream that allocates it, and the
// pinned frees of one iteration are complete when the next one allocates.)
class SteadyStateTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SteadyStateTest, RepeatedIterationsAllocateNothingNew) {
  CudaOptions options;
  options.pinned_slab_bytes = GetParam();
  std::unique_ptr<CudaBackend> backend = MakeBackend(options);
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  ASSERT_OK_AND_ASSIGN(Stream* d2h, backend->NewStream("d2h"));
  ASSERT_OK_AND_ASSIGN(Stream* h2d, backend->NewStream("h2d"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> produced, backend->NewEvent());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> offloaded, backend->NewEvent());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> reloaded, backend->NewEvent());
  const std::vector<int64_t> sizes = {3 * kMiB + 5, 1 * kMiB, 257 * kKiB};
  constexpr int kLayers = 4;
  std::vector<Buffer> sources;
  int64_t per_layer = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(Buffer source,
                         PinnedPattern(*backend, sizes[i], 40 + i));
    sources.push_back(std::move(source));
    per_layer += sizes[i];
  }
  ASSERT_OK_AND_ASSIGN(Buffer checks,
                       backend->AllocatePinned(kLayers * per_layer));

  auto iteration = [&]() {
    std::vector<Buffer> saved;  // pinned copies, layer-major
    for (int layer = 0; layer < kLayers; ++layer) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_OK_AND_ASSIGN(Buffer act,
                             backend->AllocateDevice(sizes[i], compute));
        ASSERT_OK(compute.Copy(act.data(), sources[i].data(), sizes[i]));
        ASSERT_OK(compute.Record(*produced));
        ASSERT_OK(d2h->Wait(*produced));
        ASSERT_OK_AND_ASSIGN(Buffer host, backend->AllocatePinned(sizes[i]));
        ASSERT_OK(d2h->Copy(host.data(), act.data(), sizes[i]));
        ASSERT_OK(d2h->Record(*offloaded));
        ASSERT_OK(compute.Wait(*offloaded));
        ASSERT_OK(backend->Free(act, compute));
        saved.push_back(std::move(host));
      }
    }
    int64_t offset = 0;
    for (int layer = kLayers - 1; layer >= 0; --layer) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        Buffer& host = saved[layer * sizes.size() + i];
        ASSERT_OK_AND_ASSIGN(Buffer dev,
                             backend->AllocateDevice(sizes[i], compute));
        ASSERT_OK(compute.Record(*produced));
        ASSERT_OK(h2d->Wait(*produced));
        ASSERT_OK(h2d->Copy(dev.data(), host.data(), sizes[i]));
        ASSERT_OK(backend->Free(host, *h2d));
        ASSERT_OK(h2d->Record(*reloaded));
        ASSERT_OK(compute.Wait(*reloaded));
        ASSERT_OK(compute.Copy(static_cast<char*>(checks.data()) + offset,
                               dev.data(), sizes[i]));
        ASSERT_OK(backend->Free(dev, compute));
        offset += sizes[i];
      }
    }
    ASSERT_OK(compute.Synchronize());
    ASSERT_OK(d2h->Synchronize());
    ASSERT_OK(h2d->Synchronize());
    offset = 0;
    for (int layer = kLayers - 1; layer >= 0; --layer) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_TRUE(BytesEqual(
            std::span<const uint8_t>(
                static_cast<const uint8_t*>(checks.data()) + offset,
                static_cast<size_t>(sizes[i])),
            PatternBytes(0, sizes[i], 40 + i)))
            << "layer " << layer << " tensor " << i;
        offset += sizes[i];
      }
    }
    // Scribble over the check buffer so the next iteration must rewrite it.
    std::memset(checks.data(), 0, checks.size());
  };

  for (int warm_up = 0; warm_up < 2; ++warm_up) {
    ASSERT_NO_FATAL_FAILURE(iteration());
  }
  ASSERT_OK_AND_ASSIGN(CudaBackendStats before, backend->stats());
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    ASSERT_NO_FATAL_FAILURE(iteration());
  }
  ASSERT_OK_AND_ASSIGN(CudaBackendStats after, backend->stats());
  EXPECT_GT(before.pinned_slab_allocations, 0);
  EXPECT_EQ(after.pinned_slab_allocations, before.pinned_slab_allocations);
  EXPECT_EQ(after.pinned_slab_bytes, before.pinned_slab_bytes);
  EXPECT_EQ(after.device_pool_reserved_high, before.device_pool_reserved_high);
  EXPECT_EQ(after.events_created, before.events_created);
  const int64_t per_iteration = kLayers * static_cast<int64_t>(sizes.size());
  EXPECT_EQ(after.pinned_allocations - before.pinned_allocations,
            5 * per_iteration);
  EXPECT_EQ(after.device_allocations - before.device_allocations,
            5 * 2 * per_iteration);
  EXPECT_EQ(after.device_bytes_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(SlabSizes, SteadyStateTest,
                         ::testing::Values(int64_t{64} << 20,
                                           int64_t{64} << 10),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param >= (1 << 20)
                                      ? "slab_" +
                                            std::to_string(info.param >> 20) +
                                            "MiB"
                                      : "slab_" +
                                            std::to_string(info.param >> 10) +
                                            "KiB";
                         });

// ---------------------------------------------------------------------------
// Errors. (CUDA calls fail here on purpose: compute-sanitizer runs these with
// --report-api-errors=no.)

TEST(CudaBackendErrorTest, CudaErrorStatusNamesTheCallAndTheMessage) {
  Status status = CudaErrorStatus(cudaErrorInvalidValue, "cudaMemcpyAsync",
                                  "Copy of 5 bytes on stream 'd2h'");
  EXPECT_THAT(status,
              StatusIs(StatusCode::kInternal,
                       HasSubstr("Copy of 5 bytes on stream 'd2h': "
                                 "cudaMemcpyAsync failed: "
                                 "cudaErrorInvalidValue: invalid argument")));
  EXPECT_THAT(CudaErrorStatus(cudaErrorMemoryAllocation, "cudaHostAlloc", ""),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("cudaHostAlloc failed: "
                                 "cudaErrorMemoryAllocation: out of memory")));
  EXPECT_THAT(CudaErrorStatus(cudaErrorNoDevice, "cudaGetDeviceCount", "x"),
              StatusIs(StatusCode::kUnavailable));
}

TEST(CudaBackendErrorTest, BadDeviceOrdinalCarriesTheCudaMessage) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  CudaOptions options;
  options.device = count;
  EXPECT_THAT(NewCudaBackend(options),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cudaSetDevice"),
                             HasSubstr("invalid device ordinal"),
                             HasSubstr("device " + std::to_string(count)))));
  options.device = 0;
  options.pinned_slab_bytes = 0;
  EXPECT_THAT(NewCudaBackend(options),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("pinned_slab_bytes")));
}

TEST(CudaBackendErrorTest, DeviceOutOfMemoryCarriesTheCudaMessage) {
  std::unique_ptr<CudaBackend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Stream& compute = backend->ComputeStream();
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  // More than is free, less than the device has.
  const int64_t bytes =
      static_cast<int64_t>(free_bytes + (total_bytes - free_bytes) / 2);
  ASSERT_LT(free_bytes, total_bytes);
  EXPECT_THAT(
      backend->AllocateDevice(bytes, compute),
      StatusIs(StatusCode::kResourceExhausted,
               AllOf(HasSubstr("AllocateDevice of " + std::to_string(bytes) +
                               " bytes on stream 'compute'"),
                     HasSubstr("cudaMallocFromPoolAsync"),
                     HasSubstr("out of memory"))));
  // Beyond the device's size: refused before asking CUDA.
  EXPECT_THAT(backend->AllocateDevice(int64_t{1} << 62, compute),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr(std::to_string(int64_t{1} << 62))));
  EXPECT_THAT(backend->AllocatePinned(int64_t{1} << 62),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr(std::to_string(int64_t{1} << 62))));
  // The failures changed nothing.
  ASSERT_OK_AND_ASSIGN(Buffer src, PinnedPattern(*backend, kMiB, 51));
  ASSERT_OK_AND_ASSIGN(Buffer device, backend->AllocateDevice(kMiB, compute));
  ASSERT_OK_AND_ASSIGN(Buffer dst, backend->AllocatePinned(kMiB));
  ASSERT_OK(compute.Copy(device.data(), src.data(), kMiB));
  ASSERT_OK(compute.Copy(dst.data(), device.data(), kMiB));
  ASSERT_OK(compute.Synchronize());
  EXPECT_TRUE(HoldsPattern(dst, 51));
}

}  // namespace
}  // namespace offload
