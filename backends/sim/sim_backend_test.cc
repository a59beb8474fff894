#include "backends/sim/sim_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

// Integer ceil(bytes / gbps) for whole-number bandwidths: GB/s = bytes/ns.
int64_t TransferNs(int64_t bytes, int64_t gbps) {
  return (bytes + gbps - 1) / gbps;
}

// The virtual time of the first trace entry in `phase` that `match`
// selects; -1 if none.
int64_t TimeOf(const SimBackend& sim, SimPhase phase,
               const std::function<bool(const SimTraceEntry&)>& match) {
  for (const SimTraceEntry& entry : sim.trace()) {
    if (entry.phase == phase && match(entry)) return entry.time_ns;
  }
  return -1;
}

constexpr MemorySpace kDev = MemorySpace::kDevice;
constexpr MemorySpace kPin = MemorySpace::kPinnedHost;

// Selects the copy from the start of block `src` (in `src_space`) into block
// `dst` (in `dst_space`).
std::function<bool(const SimTraceEntry&)> CopyOf(MemorySpace src_space,
                                                 uint64_t src,
                                                 MemorySpace dst_space,
                                                 uint64_t dst) {
  return [=](const SimTraceEntry& entry) {
    return entry.kind == SimOpKind::kCopy &&
           entry.src == SimBlockRef{src, src_space, 0} &&
           entry.dst.block == dst && entry.dst.space == dst_space;
  };
}

// Selects every entry of the given kind.
std::function<bool(const SimTraceEntry&)> KindIs(SimOpKind kind) {
  return [kind](const SimTraceEntry& entry) { return entry.kind == kind; };
}

std::vector<HazardKind> Kinds(const std::vector<Hazard>& hazards) {
  std::vector<HazardKind> kinds;
  for (const Hazard& hazard : hazards) kinds.push_back(hazard.kind);
  return kinds;
}

class SimBackendTest : public ::testing::Test {
 protected:
  void Make(SimOptions options) { sim_ = NewSimBackend(options); }

  Stream& NewStream(const std::string& name) {
    StatusOr<Stream*> stream = sim_->NewStream(name);
    EXPECT_OK(stream);
    return **stream;
  }
  Buffer Device(int64_t bytes, Stream& stream) {
    StatusOr<Buffer> buffer = sim_->AllocateDevice(bytes, stream);
    EXPECT_OK(buffer);
    return std::move(buffer).value();
  }
  Buffer Device(int64_t bytes) { return Device(bytes, sim_->ComputeStream()); }
  Buffer Pinned(int64_t bytes) {
    StatusOr<Buffer> buffer = sim_->AllocatePinned(bytes);
    EXPECT_OK(buffer);
    return std::move(buffer).value();
  }
  std::unique_ptr<Event> NewEvent() {
    StatusOr<std::unique_ptr<Event>> event = sim_->NewEvent();
    EXPECT_OK(event);
    return std::move(event).value();
  }
  // A kernel of `ns` that writes `buffer` (with `fill` as its bytes).
  void Write(Stream& stream, const Buffer& buffer, int64_t ns,
             uint8_t fill = 0x11, const std::string& name = "producer") {
    SimKernel kernel;
    kernel.name = name;
    kernel.duration_ns = ns;
    kernel.writes = {{buffer.data(), buffer.size()}};
    void* data = buffer.data();
    int64_t size = buffer.size();
    kernel.body = [data, size, fill](SimBackend& sim) {
      StatusOr<uint8_t*> bytes = sim.MutableBytes(data, size);
      if (bytes.ok()) std::memset(*bytes, fill, size);
    };
    ASSERT_OK(sim_->EnqueueKernel(stream, std::move(kernel)));
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
};

// ---------------------------------------------------------------- timing

TEST_F(SimBackendTest, CopyTakesLatencyPlusBytesOverBandwidth) {
  SimOptions options;
  options.store_bytes = false;  // timing only: 1 GiB of bytes is not needed
  options.h2d_gbps = 25.0;
  Make(options);
  Stream& d2h = NewStream("d2h");
  Buffer device = Device(kGiB);
  Buffer host = Pinned(kGiB);
  sim_->RunUntilIdle();
  ASSERT_EQ(sim_->NowNs(), 0);

  ASSERT_OK(d2h.Copy(host.data(), device.data(), kGiB));
  ASSERT_OK(d2h.Synchronize());
  EXPECT_EQ(sim_->NowNs(), 2000 + TransferNs(kGiB, 55));

  int64_t start = sim_->NowNs();
  ASSERT_OK(d2h.Copy(device.data(), host.data(), kGiB));
  ASSERT_OK(d2h.Synchronize());
  EXPECT_EQ(sim_->NowNs() - start, 2000 + TransferNs(kGiB, 25));
  EXPECT_EQ(sim_->CopyDurationNs(MemorySpace::kPinnedHost, MemorySpace::kDevice,
                                 kGiB),
            2000 + TransferNs(kGiB, 55));
}

TEST_F(SimBackendTest, OppositeDirectionsRunConcurrentlyAtFullRate) {
  Stream& d2h = NewStream("d2h");
  Stream& h2d = NewStream("h2d");
  Buffer device_a = Device(8 * kMiB), device_b = Device(8 * kMiB);
  Buffer host_a = Pinned(8 * kMiB), host_b = Pinned(8 * kMiB);
  sim_->RunUntilIdle();
  ASSERT_OK(d2h.Copy(host_a.data(), device_a.data(), 8 * kMiB));
  ASSERT_OK(h2d.Copy(device_b.data(), host_b.data(), 8 * kMiB));
  sim_->RunUntilIdle();
  int64_t one_copy = 2000 + TransferNs(8 * kMiB, 55);
  EXPECT_EQ(sim_->NowNs(), one_copy);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kDev, 1, kPin, 3)), 0);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kPin, 4, kDev, 2)), 0);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kEnd, CopyOf(kDev, 1, kPin, 3)), one_copy);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kEnd, CopyOf(kPin, 4, kDev, 2)), one_copy);
}

TEST_F(SimBackendTest, SameDirectionCopiesSerializeOnTheCopyEngine) {
  Stream& first = NewStream("d2h-a");
  Stream& second = NewStream("d2h-b");
  Buffer device_a = Device(4 * kMiB), device_b = Device(4 * kMiB);
  Buffer host_a = Pinned(4 * kMiB), host_b = Pinned(4 * kMiB);
  sim_->RunUntilIdle();
  ASSERT_OK(first.Copy(host_a.data(), device_a.data(), 4 * kMiB));
  ASSERT_OK(second.Copy(host_b.data(), device_b.data(), 4 * kMiB));
  sim_->RunUntilIdle();
  int64_t one_copy = 2000 + TransferNs(4 * kMiB, 55);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kDev, 2, kPin, 4)),
            one_copy);
  EXPECT_EQ(sim_->NowNs(), 2 * one_copy);
}

TEST_F(SimBackendTest, KernelsOverlapCopiesAndStreamsAreFifo) {
  Stream& d2h = NewStream("d2h");
  Buffer a = Device(kMiB), b = Device(kMiB);
  Buffer host = Pinned(kMiB);
  sim_->RunUntilIdle();
  Write(sim_->ComputeStream(), a, 50'000, 0x11, "long-kernel");
  ASSERT_OK(d2h.Copy(host.data(), b.data(), kMiB));  // independent of a
  // FIFO: this copy on the compute stream waits for the kernel before it.
  ASSERT_OK(sim_->ComputeStream().Copy(b.data(), a.data(), kMiB));
  sim_->RunUntilIdle();
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kDev, 2, kPin, 3)), 0);
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kDev, 1, kDev, 2)), 50'000);
  EXPECT_THAT(sim_->hazards(), SizeIs(1));  // b read and written, unordered
}

TEST_F(SimBackendTest, WaitOrdersAcrossStreamsAndCapturesAtCallTime) {
  Stream& d2h = NewStream("d2h");
  Buffer a = Device(kMiB);
  Buffer host = Pinned(kMiB);
  std::unique_ptr<Event> ready = NewEvent();
  sim_->RunUntilIdle();
  Write(sim_->ComputeStream(), a, 10'000, 0x22, "first");
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Wait(*ready));
  // Re-recording after more work does not move the wait enqueued above.
  SimKernel second{"second", 30'000, {}, {}, nullptr};
  ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(), second));
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Copy(host.data(), a.data(), kMiB));
  sim_->RunUntilIdle();
  EXPECT_EQ(TimeOf(*sim_, SimPhase::kStart, CopyOf(kDev, 1, kPin, 2)), 10'000);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
  EXPECT_EQ(host.size(), kMiB);
  EXPECT_EQ(static_cast<uint8_t*>(host.data())[kMiB - 1], 0x22);
}

TEST_F(SimBackendTest, EventQueryReflectsDeviceTimeAndSynchronizeAdvancesIt) {
  std::unique_ptr<Event> event = NewEvent();
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));  // never recorded
  ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(),
                                SimKernel{"k", 7'000, {}, {}, nullptr}));
  ASSERT_OK(sim_->ComputeStream().Record(*event));
  EXPECT_THAT(event->Query(), IsOkAndHolds(false));
  sim_->RunFor(6'999);
  EXPECT_EQ(sim_->NowNs(), 6'999);
  EXPECT_THAT(event->Query(), IsOkAndHolds(false));
  ASSERT_OK(event->Synchronize());
  EXPECT_EQ(sim_->NowNs(), 7'000);
  EXPECT_THAT(event->Query(), IsOkAndHolds(true));
  sim_->RunFor(500);  // the host spends time while the device is idle
  EXPECT_EQ(sim_->NowNs(), 7'500);
}

// Runs a small offload-like program; returns the trace.
std::vector<SimTraceEntry> RunProgram(const SimOptions& options) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(options);
  Stream* d2h = *sim->NewStream("d2h");
  Stream* h2d = *sim->NewStream("h2d");
  std::vector<Buffer> device, host;
  std::vector<std::unique_ptr<Event>> events;
  for (int layer = 0; layer < 4; ++layer) {
    device.push_back(*sim->AllocateDevice(2 * kMiB, sim->ComputeStream()));
    host.push_back(*sim->AllocatePinned(2 * kMiB));
    events.push_back(*sim->NewEvent());
    SimKernel kernel{"layer" + std::to_string(layer), 40'000,
                     {}, {{device.back().data(), 2 * kMiB}}, nullptr};
    (void)sim->EnqueueKernel(sim->ComputeStream(), kernel);
    (void)sim->ComputeStream().Record(*events.back());
    (void)d2h->Wait(*events.back());
    (void)d2h->Copy(host.back().data(), device.back().data(), 2 * kMiB);
    (void)h2d->Copy(device.back().data(), host.back().data(), kKiB);
  }
  sim->RunUntilIdle();
  device.clear();
  sim->RunUntilIdle();
  host.clear();
  return sim->trace();
}

std::string Text(const std::vector<SimTraceEntry>& trace) {
  std::string out;
  for (const SimTraceEntry& entry : trace) out += entry.ToString() + "\n";
  return out;
}

TEST(SimDeterminismTest, SameSeedSameTraceDifferentSeedDifferentTrace) {
  SimOptions options;
  options.duration_jitter = 0.2;
  options.seed = 7;
  std::vector<SimTraceEntry> first = RunProgram(options);
  std::vector<SimTraceEntry> again = RunProgram(options);
  EXPECT_EQ(Text(first), Text(again));  // the readable diff
  EXPECT_TRUE(first == again);          // every field
  options.seed = 8;
  EXPECT_NE(Text(first), Text(RunProgram(options)));
  EXPECT_FALSE(first == RunProgram(options));
  // Without jitter the seed does not matter: durations are exact.
  options.duration_jitter = 0.0;
  std::vector<SimTraceEntry> exact = RunProgram(options);
  options.seed = 9;
  EXPECT_EQ(Text(exact), Text(RunProgram(options)));
  EXPECT_TRUE(exact == RunProgram(options));
  EXPECT_THAT(Text(exact), HasSubstr("t=40000 end"));
}

// ---------------------------------------------------------------- hazards

TEST_F(SimBackendTest, CopyNotWaitingForItsProducerIsReadBeforeWrite) {
  Stream& d2h = NewStream("d2h");
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  sim_->RunUntilIdle();  // the allocation is ordered before everything below
  Write(sim_->ComputeStream(), activation, 10'000, 0x33, "forward");
  ASSERT_OK(d2h.Copy(host.data(), activation.data(), kMiB));  // no wait
  sim_->RunUntilIdle();
  ASSERT_THAT(sim_->hazards(), SizeIs(1));
  const Hazard& hazard = sim_->hazards()[0];
  EXPECT_EQ(hazard.kind, HazardKind::kReadBeforeWrite);
  EXPECT_THAT(hazard.earlier, HasSubstr("kernel forward on 'compute'"));
  EXPECT_THAT(hazard.later, HasSubstr("copy device#1+0 -> pinned#2"));
  EXPECT_THAT(hazard.later, HasSubstr("on 'd2h'"));
  EXPECT_THAT(hazard.memory, HasSubstr("device#1 bytes [0, 1048576)"));
  // The copy ran at once and read the poison, not the kernel's bytes.
  EXPECT_EQ(static_cast<uint8_t*>(host.data())[0], 0xCD);
}

TEST_F(SimBackendTest, CopyWaitingForItsProducerHasNoHazard) {
  Stream& d2h = NewStream("d2h");
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  std::unique_ptr<Event> ready = NewEvent();
  sim_->RunUntilIdle();
  Write(sim_->ComputeStream(), activation, 10'000, 0x33, "forward");
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Wait(*ready));
  ASSERT_OK(d2h.Copy(host.data(), activation.data(), kMiB));
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty());
  EXPECT_EQ(static_cast<uint8_t*>(host.data())[0], 0x33);
}

TEST_F(SimBackendTest, FreeWhileACopyStillReadsIsFreeDuringUse) {
  Stream& d2h = NewStream("d2h");
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  std::unique_ptr<Event> ready = NewEvent();
  Write(sim_->ComputeStream(), activation, 10'000);
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Wait(*ready));
  ASSERT_OK(d2h.Copy(host.data(), activation.data(), kMiB));
  // Bug: the compute stream frees without waiting for the copy.
  ASSERT_OK(sim_->Free(activation, sim_->ComputeStream()));
  sim_->RunUntilIdle();
  ASSERT_THAT(Kinds(sim_->hazards()), ElementsAre(HazardKind::kFreeDuringUse));
  EXPECT_THAT(sim_->hazards()[0].earlier, HasSubstr("copy device#1+0"));
  EXPECT_THAT(sim_->hazards()[0].later, HasSubstr("free device#1"));
}

TEST_F(SimBackendTest, FreeOrderedAfterTheCopyHasNoHazard) {
  Stream& d2h = NewStream("d2h");
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  std::unique_ptr<Event> ready = NewEvent(), copied = NewEvent();
  Write(sim_->ComputeStream(), activation, 10'000);
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Wait(*ready));
  ASSERT_OK(d2h.Copy(host.data(), activation.data(), kMiB));
  ASSERT_OK(d2h.Record(*copied));
  ASSERT_OK(sim_->ComputeStream().Wait(*copied));
  ASSERT_OK(sim_->Free(activation, sim_->ComputeStream()));
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty());
  EXPECT_EQ(static_cast<uint8_t*>(host.data())[0], 0x11);
}

TEST_F(SimBackendTest, TouchingFreedMemoryIsUseAfterFree) {
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  void* stale = activation.data();
  ASSERT_OK(sim_->Free(activation, sim_->ComputeStream()));
  EXPECT_TRUE(activation.empty());
  ASSERT_OK(sim_->ComputeStream().Copy(host.data(), stale, kMiB));
  sim_->RunUntilIdle();
  ASSERT_THAT(Kinds(sim_->hazards()), ElementsAre(HazardKind::kUseAfterFree));
  EXPECT_THAT(sim_->hazards()[0].earlier, HasSubstr("free device#1"));
  EXPECT_EQ(static_cast<uint8_t*>(host.data())[0], 0xDE);  // lost bytes
}

TEST_F(SimBackendTest, UseOnAnotherStreamBeforeTheAllocationIsOrdered) {
  Stream& h2d = NewStream("h2d");
  Buffer host = Pinned(kMiB);
  Buffer reload = Device(kMiB);  // ordered on the compute stream only
  ASSERT_OK(h2d.Copy(reload.data(), host.data(), kMiB));
  sim_->RunUntilIdle();
  ASSERT_THAT(Kinds(sim_->hazards()),
              ElementsAre(HazardKind::kUseBeforeAllocation));
}

TEST_F(SimBackendTest, OverwritingWhileACopyReadsIsWriteDuringRead) {
  Stream& d2h = NewStream("d2h");
  Buffer activation = Device(kMiB);
  Buffer host = Pinned(kMiB);
  std::unique_ptr<Event> ready = NewEvent();
  Write(sim_->ComputeStream(), activation, 1'000);
  ASSERT_OK(sim_->ComputeStream().Record(*ready));
  ASSERT_OK(d2h.Wait(*ready));
  ASSERT_OK(d2h.Copy(host.data(), activation.data(), kMiB));
  Write(sim_->ComputeStream(), activation, 1'000, 0x44, "next-layer");
  sim_->RunUntilIdle();
  ASSERT_THAT(Kinds(sim_->hazards()),
              ElementsAre(HazardKind::kWriteDuringRead));
  EXPECT_THAT(sim_->hazards()[0].later, HasSubstr("next-layer"));
}

TEST_F(SimBackendTest, DroppingPinnedMemoryUnderAnInflightCopyIsFreeDuringUse) {
  Stream& h2d = NewStream("h2d");
  Buffer device = Device(kMiB, h2d);
  {
    Buffer host = Pinned(kMiB);
    ASSERT_OK(h2d.Copy(device.data(), host.data(), kMiB));
  }  // ~Buffer frees the pinned memory at once, the copy still pending
  sim_->RunUntilIdle();
  EXPECT_THAT(Kinds(sim_->hazards()), ElementsAre(HazardKind::kFreeDuringUse));
}

TEST_F(SimBackendTest, DroppingPinnedMemoryAfterSynchronizingIsSafe) {
  Stream& h2d = NewStream("h2d");
  Buffer device = Device(kMiB, h2d);
  {
    Buffer host = Pinned(kMiB);
    ASSERT_OK(h2d.Copy(device.data(), host.data(), kMiB));
    ASSERT_OK(h2d.Synchronize());  // the host observed the copy's end
  }
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

// ---------------------------------------------------------------- memory

TEST_F(SimBackendTest, DeviceCapacityIsEnforcedAndFailuresChangeNothing) {
  SimOptions options;
  options.device_capacity_bytes = kMiB;
  Make(options);
  Buffer big = Device(768 * kKiB);
  size_t trace_size = sim_->trace().size();
  StatusOr<Buffer> too_much = sim_->AllocateDevice(512 * kKiB,
                                                   sim_->ComputeStream());
  EXPECT_THAT(too_much, StatusIs(StatusCode::kResourceExhausted,
                                 HasSubstr("stream 'compute'")));
  EXPECT_THAT(too_much.status().message(), HasSubstr("262144 B"));
  EXPECT_EQ(sim_->trace().size(), trace_size);
  EXPECT_EQ(sim_->device_memory().allocations, 1);
  Buffer fits = Device(256 * kKiB);
  EXPECT_FALSE(fits.empty());
}

TEST_F(SimBackendTest, FreedMemoryIsReusableInStreamOrderOnly) {
  SimOptions options;
  options.device_capacity_bytes = kMiB;
  Make(options);
  Stream& other = NewStream("other");
  Buffer first = Device(768 * kKiB);
  // Keep the compute stream busy so that the free stays pending.
  ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(),
                                SimKernel{"busy", 100'000, {}, {}, nullptr}));
  ASSERT_OK(sim_->Free(first, sim_->ComputeStream()));
  // Another stream could run before the free: the memory is not yet its.
  EXPECT_THAT(sim_->AllocateDevice(768 * kKiB, other),
              StatusIs(StatusCode::kResourceExhausted));
  // The same stream is ordered after the free: reuse is fine.
  Buffer second = Device(768 * kKiB);
  ASSERT_OK(sim_->Free(second, sim_->ComputeStream()));
  sim_->RunUntilIdle();
  Buffer third = Device(768 * kKiB, other);
  EXPECT_FALSE(third.empty());
  EXPECT_LE(sim_->device_memory().peak_bytes, kMiB);
}

TEST_F(SimBackendTest, MemoryStatisticsFollowDeviceTime) {
  ASSERT_OK(sim_->EnqueueKernel(sim_->ComputeStream(),
                                SimKernel{"warmup", 10'000, {}, {}, nullptr}));
  Buffer a = Device(3 * kMiB);  // counted once the stream reaches it
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 3 * kMiB);
  EXPECT_EQ(sim_->device_memory().peak_time_ns, 10'000);
  ASSERT_OK(sim_->Free(a, sim_->ComputeStream()));
  Buffer b = Device(2 * kMiB);  // reuses a's memory in stream order
  sim_->RunUntilIdle();
  SimMemoryStats device = sim_->device_memory();
  EXPECT_EQ(device.live_bytes, 2 * kMiB);
  EXPECT_EQ(device.peak_bytes, 3 * kMiB);  // never both at once
  EXPECT_EQ(device.allocations, 2);
  EXPECT_EQ(device.capacity_bytes, int64_t{80} << 30);

  Buffer host = Pinned(kMiB);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, kMiB);
  ASSERT_OK(sim_->Free(host, sim_->ComputeStream()));
  EXPECT_EQ(sim_->pinned_memory().live_bytes, kMiB);  // free still pending
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().peak_bytes, kMiB);
}

TEST_F(SimBackendTest, PinnedCapacityIsEnforced) {
  SimOptions options;
  options.pinned_capacity_bytes = 2 * kMiB;
  Make(options);
  Buffer a = Pinned(2 * kMiB);
  EXPECT_THAT(sim_->AllocatePinned(1), StatusIs(StatusCode::kResourceExhausted,
                                                HasSubstr("AllocatePinned")));
  a = Buffer();  // destroying the handle returns the memory
  EXPECT_OK(sim_->AllocatePinned(2 * kMiB));
}

TEST_F(SimBackendTest, CopiesMoveRealBytesAndFreshDeviceMemoryIsPoisoned) {
  Buffer device = Device(4 * kKiB);
  Buffer in = Pinned(4 * kKiB), out = Pinned(4 * kKiB);
  auto* in_bytes = static_cast<uint8_t*>(in.data());
  for (int i = 0; i < 4 * kKiB; ++i) in_bytes[i] = static_cast<uint8_t>(i * 7);
  Stream& stream = sim_->ComputeStream();
  ASSERT_OK(stream.Copy(out.data(), device.data(), 16));
  ASSERT_OK(stream.Synchronize());
  EXPECT_EQ(static_cast<uint8_t*>(out.data())[15], 0xCD);
  // Offsets inside allocations work on both sides.
  ASSERT_OK(stream.Copy(static_cast<char*>(device.data()) + 100,
                        in_bytes + 200, 1000));
  ASSERT_OK(stream.Copy(out.data(), static_cast<char*>(device.data()) + 100,
                        1000));
  ASSERT_OK(stream.Synchronize());
  EXPECT_EQ(std::memcmp(out.data(), in_bytes + 200, 1000), 0);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

// ---------------------------------------------------------------- errors

TEST_F(SimBackendTest, BadCopiesAreRejectedWithoutSideEffects) {
  Buffer device = Device(4 * kKiB);
  Buffer host = Pinned(4 * kKiB);
  sim_->RunUntilIdle();
  size_t trace_size = sim_->trace().size();
  Stream& stream = sim_->ComputeStream();
  char not_ours[64];
  EXPECT_THAT(stream.Copy(device.data(), not_ours, 64),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("source range of 64 B is not inside")));
  EXPECT_THAT(stream.Copy(host.data(), device.data(), 4 * kKiB + 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("source")));
  EXPECT_THAT(stream.Copy(static_cast<char*>(device.data()) + 10,
                          device.data(), 100),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(stream.Copy(host.data(), device.data(), -1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(stream.Copy(nullptr, device.data(), 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(sim_->EnqueueKernel(stream, SimKernel{"k", -1, {}, {}, nullptr}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("kernel 'k'")));
  EXPECT_EQ(sim_->trace().size(), trace_size);
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

TEST_F(SimBackendTest, ForeignStreamsAndEventsAreRejected) {
  std::unique_ptr<SimBackend> other = NewSimBackend(SimOptions{});
  std::unique_ptr<Event> foreign = *other->NewEvent();
  EXPECT_THAT(sim_->ComputeStream().Record(*foreign),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("another")));
  EXPECT_THAT(sim_->ComputeStream().Wait(*foreign),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("another")));
  EXPECT_THAT(sim_->AllocateDevice(16, other->ComputeStream()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("another")));
  EXPECT_THAT(sim_->EnqueueKernel(other->ComputeStream(), SimKernel{}),
              StatusIs(StatusCode::kInvalidArgument));
  Buffer mine = Device(16);
  EXPECT_THAT(sim_->Free(mine, other->ComputeStream()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(mine.empty());
}

TEST_F(SimBackendTest, MutableBytesChecksItsRange) {
  Buffer device = Device(64);
  EXPECT_OK(sim_->MutableBytes(device.data(), 64));
  EXPECT_THAT(sim_->MutableBytes(device.data(), 65),
              StatusIs(StatusCode::kInvalidArgument));
  void* stale = device.data();
  ASSERT_OK(sim_->Free(device, sim_->ComputeStream()));
  EXPECT_OK(sim_->MutableBytes(stale, 1));  // the free has not run yet
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->MutableBytes(stale, 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("freed")));

  SimOptions options;
  options.store_bytes = false;
  Make(options);
  Buffer empty = Device(64);
  EXPECT_THAT(sim_->MutableBytes(empty.data(), 1),
              StatusIs(StatusCode::kFailedPrecondition));
}

// ---------------------------------------------------------------- trace

TEST_F(SimBackendTest, TraceRecordsEveryKindOfOperation) {
  Stream& d2h = NewStream("d2h");
  std::unique_ptr<Event> event = NewEvent();
  Buffer device = Device(kKiB);
  Buffer host = Pinned(kKiB);
  ASSERT_OK(sim_->ComputeStream().Record(*event));
  ASSERT_OK(d2h.Wait(*event));
  ASSERT_OK(d2h.Copy(host.data(), device.data(), kKiB));
  ASSERT_OK(d2h.Synchronize());
  ASSERT_OK(sim_->Free(device, d2h));
  sim_->RunUntilIdle();
  std::string text = sim_->TraceText();
  for (SimOpKind kind : {SimOpKind::kAlloc, SimOpKind::kRecord,
                         SimOpKind::kWait, SimOpKind::kCopy,
                         SimOpKind::kFree}) {
    for (SimPhase phase : {SimPhase::kEnqueue, SimPhase::kStart,
                           SimPhase::kEnd}) {
      EXPECT_THAT(text, HasSubstr(std::string(SimPhaseName(phase)) + " op="))
          << SimPhaseName(phase);
      EXPECT_NE(TimeOf(*sim_, phase, KindIs(kind)), -1)
          << SimPhaseName(phase) << " " << SimOpKindName(kind);
    }
  }
  EXPECT_THAT(text, HasSubstr("host] alloc pinned#2 1024 B"));
  EXPECT_THAT(text, HasSubstr("host] synchronize stream 'd2h'"));
  EXPECT_THAT(sim_->trace(),
              Contains(Field(&SimTraceEntry::stream_name, "d2h")));
}

// What a timeline drawn from the trace needs is in fields: per operation its
// stream, interval (start and end share its sequence number), blocks and
// bytes; per wait the stream it waits for; host entries apart.
TEST_F(SimBackendTest, TraceEntriesCarryTypedFields) {
  Stream& d2h = NewStream("d2h");
  std::unique_ptr<Event> event = NewEvent();
  Buffer device = Device(kKiB);  // device#1
  Buffer host = Pinned(kKiB);    // pinned#2
  ASSERT_OK(sim_->ComputeStream().Record(*event));
  ASSERT_OK(d2h.Wait(*event));
  ASSERT_OK(
      d2h.Copy(static_cast<char*>(host.data()) + 256, device.data(), 512));
  ASSERT_OK(event->Synchronize());
  sim_->RunUntilIdle();
  const std::vector<SimTraceEntry>& trace = sim_->trace();

  std::vector<SimTraceEntry> copy, wait;
  for (const SimTraceEntry& entry : trace) {
    if (entry.kind == SimOpKind::kCopy) copy.push_back(entry);
    if (entry.kind == SimOpKind::kWait) wait.push_back(entry);
  }
  ASSERT_THAT(copy, SizeIs(3));
  EXPECT_EQ(copy[0].phase, SimPhase::kEnqueue);
  EXPECT_EQ(copy[1].phase, SimPhase::kStart);
  EXPECT_EQ(copy[2].phase, SimPhase::kEnd);
  for (const SimTraceEntry& entry : copy) {
    EXPECT_NE(entry.seq, 0u);
    EXPECT_EQ(entry.seq, copy[0].seq);
    EXPECT_EQ(entry.stream, 1);
    EXPECT_EQ(entry.stream_name, "d2h");
    EXPECT_EQ(entry.src, (SimBlockRef{1, kDev, 0}));
    EXPECT_EQ(entry.dst, (SimBlockRef{2, kPin, 256}));
    EXPECT_EQ(entry.bytes, 512);
  }
  EXPECT_EQ(copy[2].time_ns - copy[1].time_ns,
            sim_->CopyDurationNs(kPin, kDev, 512));
  EXPECT_EQ(copy[0].ToString(),
            "t=0 enqueue op=" + std::to_string(copy[0].seq) +
                " [d2h] copy device#1+0 -> pinned#2+256 512 B");

  ASSERT_THAT(wait, SizeIs(3));
  EXPECT_EQ(wait[0].label, "event#1");
  EXPECT_EQ(wait[0].stream, 1);
  EXPECT_EQ(wait[0].peer_stream, 0);
  EXPECT_EQ(wait[0].peer_stream_name, "compute");

  // The device allocation is a compute-stream operation; the pinned one a
  // host entry.
  EXPECT_EQ(trace[0].phase, SimPhase::kEnqueue);
  EXPECT_EQ(trace[0].kind, SimOpKind::kAlloc);
  EXPECT_EQ(trace[0].stream, 0);
  EXPECT_EQ(trace[0].stream_name, "compute");
  EXPECT_EQ(trace[0].dst, (SimBlockRef{1, kDev, 0}));
  EXPECT_EQ(trace[0].bytes, kKiB);
  EXPECT_EQ(trace[1].phase, SimPhase::kHost);
  EXPECT_EQ(trace[1].kind, SimOpKind::kAlloc);
  EXPECT_EQ(trace[1].seq, 0u);
  EXPECT_EQ(trace[1].stream, -1);
  EXPECT_EQ(trace[1].stream_name, "host");
  EXPECT_EQ(trace[1].dst, (SimBlockRef{2, kPin, 0}));

  std::vector<SimOpKind> host_kinds;
  for (const SimTraceEntry& entry : trace) {
    if (entry.phase == SimPhase::kHost) host_kinds.push_back(entry.kind);
  }
  EXPECT_THAT(host_kinds, ElementsAre(SimOpKind::kAlloc,
                                      SimOpKind::kSynchronizeEvent,
                                      SimOpKind::kSynchronizeDevice));
  auto sync = std::find_if(trace.begin(), trace.end(), [](const auto& entry) {
    return entry.kind == SimOpKind::kSynchronizeEvent;
  });
  ASSERT_NE(sync, trace.end());
  EXPECT_EQ(sync->label, "event#1");
  EXPECT_EQ(sync->peer_stream, 0);
  EXPECT_EQ(sync->ToString(),
            "t=" + std::to_string(sync->time_ns) +
                " host [host] synchronize event#1");
}

// ---------------------------------------------------------------- gather

TEST_F(SimBackendTest, GatherIsOneKernelThatMovesTheViewsBytes) {
  SimOptions options;
  options.d2d_gbps = 100.0;
  Make(options);
  // A [4, 8] f32 tensor; gather its transpose ([8, 4], strides [1, 8]).
  Buffer source = Device(128);
  Buffer dense = Device(128);
  Buffer in = Pinned(128), out = Pinned(128);
  auto* floats = static_cast<float*>(in.data());
  for (int i = 0; i < 32; ++i) floats[i] = static_cast<float>(i);
  Stream& stream = sim_->ComputeStream();
  ASSERT_OK(stream.Copy(source.data(), in.data(), 128));
  sim_->RunUntilIdle();
  size_t before = sim_->trace().size();
  int64_t start = sim_->NowNs();
  ASSERT_OK(stream.Gather(dense.data(), source.data(), 4, {8, 4}, {1, 8}));
  ASSERT_OK(stream.Synchronize());
  EXPECT_EQ(sim_->NowNs() - start, 2000 + TransferNs(128, 100));
  int gathers = 0;
  for (size_t i = before; i < sim_->trace().size(); ++i) {
    gathers += sim_->trace()[i].phase == SimPhase::kEnqueue;
  }
  EXPECT_EQ(gathers, 1);
  ASSERT_OK(stream.Copy(out.data(), dense.data(), 128));
  ASSERT_OK(stream.Synchronize());
  auto* got = static_cast<float*>(out.data());
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[r * 4 + c], c * 8 + r);
  }
  EXPECT_THAT(sim_->hazards(), IsEmpty());
}

TEST_F(SimBackendTest, GatherIsCheckedForHazardsOverTheViewsExtent) {
  Stream& side = NewStream("side");
  Buffer source = Device(kKiB), dense = Device(kKiB, side);
  sim_->RunUntilIdle();
  Write(sim_->ComputeStream(), source, 5'000);
  // On another stream, not waiting for the producer: reads too early.
  ASSERT_OK(side.Gather(dense.data(), source.data(), 4, {16}, {2}));
  sim_->RunUntilIdle();
  EXPECT_THAT(Kinds(sim_->hazards()),
              ElementsAre(HazardKind::kReadBeforeWrite));
  EXPECT_THAT(side.Gather(dense.data(), source.data(), 4, {300}, {1}),
              StatusIs(StatusCode::kInvalidArgument));  // past the end
}

}  // namespace
}  // namespace offload
