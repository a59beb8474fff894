// Graph capture on the simulator (sim_graph.cc): capture records calls and
// runs nothing; a launch replays them with the same bytes, timing, memory
// statistics, trace and hazard checks as the same calls made eagerly. The
// calls refused during a capture are checked by GraphConformanceTest
// (testing/backend_conformance.cc, run here by sim_conformance_test); this
// file has what is particular to the simulator.

#include <cstdint>
#include <cstring>
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
using ::testing::Contains;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;

// What a stream operation looked like, without block ids or event names
// (they differ between an eager run and a replay) and with time relative
// to the first entry.
std::vector<std::string> StreamOps(const SimBackend& sim, size_t from) {
  std::vector<std::string> out;
  int64_t t0 = -1;
  for (size_t i = from; i < sim.trace().size(); ++i) {
    const SimTraceEntry& e = sim.trace()[i];
    if (e.phase == SimPhase::kHost) continue;
    if (t0 < 0) t0 = e.time_ns;
    std::string line = std::string(SimPhaseName(e.phase)) + " " +
                       std::string(SimOpKindName(e.kind)) + " [" +
                       e.stream_name + "] " + std::to_string(e.bytes) +
                       " B t=+" + std::to_string(e.time_ns - t0);
    if (e.kind == SimOpKind::kKernel) line += " " + e.label;
    if (e.kind == SimOpKind::kWait) line += " on '" + e.peer_stream_name + "'";
    out.push_back(line);
  }
  return out;
}

int Count(const SimBackend& sim, SimPhase phase, SimOpKind kind,
          size_t from = 0) {
  int n = 0;
  for (size_t i = from; i < sim.trace().size(); ++i) {
    n += sim.trace()[i].phase == phase && sim.trace()[i].kind == kind;
  }
  return n;
}

// The hazards, one per line, for failure messages.
std::string HazardText(const SimBackend& sim) {
  std::string out;
  for (const Hazard& hazard : sim.hazards()) out += hazard.ToString() + "\n";
  return out;
}

std::vector<HazardKind> Kinds(const std::vector<Hazard>& hazards) {
  std::vector<HazardKind> kinds;
  for (const Hazard& hazard : hazards) kinds.push_back(hazard.kind);
  return kinds;
}

// A kernel of `ns` reading `in` and writing `out` (same size): out = in + add.
SimKernel AddKernel(const Buffer& in, const Buffer& out, uint8_t add,
                    int64_t ns = 5000, std::string name = "add") {
  SimKernel kernel;
  kernel.name = std::move(name);
  kernel.duration_ns = ns;
  kernel.reads = {{in.data(), in.size()}};
  kernel.writes = {{out.data(), out.size()}};
  const void* src = in.data();
  void* dst = out.data();
  int64_t n = in.size();
  kernel.body = [src, dst, n, add](SimBackend& sim) {
    StatusOr<uint8_t*> from = sim.MutableBytes(src, n);
    StatusOr<uint8_t*> to = sim.MutableBytes(dst, n);
    if (!from.ok() || !to.ok()) return;
    for (int64_t i = 0; i < n; ++i) (*to)[i] = (*from)[i] + add;
  };
  return kernel;
}

void Fill(const Buffer& pinned, uint8_t value) {
  std::memset(pinned.data(), value, pinned.size());
}

std::vector<uint8_t> Bytes(const Buffer& pinned) {
  const auto* p = static_cast<const uint8_t*>(pinned.data());
  return std::vector<uint8_t>(p, p + pinned.size());
}

class SimGraphTest : public ::testing::Test {
 protected:
  static SimOptions Jittery() {
    SimOptions options;
    options.seed = 7;
    options.duration_jitter = 0.25;
    return options;
  }
  void Make(SimOptions options) { sim_ = NewSimBackend(options); }
  Stream& compute() { return sim_->ComputeStream(); }
  Stream& NewStream(const std::string& name) {
    StatusOr<Stream*> stream = sim_->NewStream(name);
    EXPECT_OK(stream);
    return **stream;
  }
  Buffer Device(int64_t bytes, Stream* stream = nullptr) {
    StatusOr<Buffer> buffer =
        sim_->AllocateDevice(bytes, stream ? *stream : compute());
    EXPECT_OK(buffer);
    return std::move(buffer).value();
  }
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
  std::unique_ptr<GraphExec> Instantiate(const Graph& graph) {
    StatusOr<std::unique_ptr<GraphExec>> exec = sim_->Instantiate(graph);
    EXPECT_OK(exec);
    return exec.ok() ? std::move(exec).value() : nullptr;
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
};

// The chain H2D copy, kernel, D2H copy on the compute stream, with buffers
// allocated before it.
struct Chain {
  Buffer in_host, in_dev, out_dev, out_host;
};

Chain MakeChain(SimBackend& sim, int64_t n) {
  Chain c;
  c.in_host = std::move(sim.AllocatePinned(n)).value();
  c.out_host = std::move(sim.AllocatePinned(n)).value();
  c.in_dev = std::move(sim.AllocateDevice(n, sim.ComputeStream())).value();
  c.out_dev = std::move(sim.AllocateDevice(n, sim.ComputeStream())).value();
  Fill(c.in_host, 10);
  Fill(c.out_host, 0);
  return c;
}

Status EnqueueChain(SimBackend& sim, Chain& c) {
  Stream& s = sim.ComputeStream();
  OFFLOAD_RETURN_IF_ERROR(s.Copy(c.in_dev.data(), c.in_host.data(),
                                 c.in_dev.size()));
  OFFLOAD_RETURN_IF_ERROR(sim.EnqueueKernel(s, AddKernel(c.in_dev, c.out_dev, 5)));
  return s.Copy(c.out_host.data(), c.out_dev.data(), c.out_dev.size());
}

TEST_F(SimGraphTest, DefaultBackendSupportsGraphs) {
  EXPECT_TRUE(sim_->SupportsGraphs());
  EXPECT_FALSE(sim_->IsCapturing(compute()));
}

TEST_F(SimGraphTest, CapturedChainRunsOnlyWhenLaunchedAndMatchesEager) {
  const int64_t n = 64 * kKiB;
  // Eager reference, on its own backend with the same seed.
  std::unique_ptr<SimBackend> eager = NewSimBackend(Jittery());
  Chain ec = MakeChain(*eager, n);
  eager->RunUntilIdle();
  const size_t eager_from = eager->trace().size();
  ASSERT_OK(EnqueueChain(*eager, ec));
  ASSERT_OK(eager->ComputeStream().Synchronize());
  ASSERT_THAT(Bytes(ec.out_host), Each(15));

  Make(Jittery());
  Chain c = MakeChain(*sim_, n);
  sim_->RunUntilIdle();
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  EXPECT_TRUE(sim_->IsCapturing(compute()));
  const size_t capture_from = sim_->trace().size();
  ASSERT_OK(EnqueueChain(*sim_, c));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Graph> graph,
                       sim_->EndCapture(compute()));
  EXPECT_FALSE(sim_->IsCapturing(compute()));
  EXPECT_EQ(graph->size(), 3);
  // Nothing was enqueued, nothing runs.
  EXPECT_EQ(Count(*sim_, SimPhase::kEnqueue, SimOpKind::kCopy, capture_from), 0);
  EXPECT_EQ(Count(*sim_, SimPhase::kHost, SimOpKind::kCapture, capture_from), 3);
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->NowNs(), 0);
  EXPECT_THAT(Bytes(c.out_host), Each(0));

  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  ASSERT_NE(exec, nullptr);
  const size_t launch_from = sim_->trace().size();
  ASSERT_OK(sim_->Launch(*exec, compute()));
  EXPECT_EQ(Count(*sim_, SimPhase::kHost, SimOpKind::kGraphLaunch, launch_from),
            1);
  ASSERT_OK(compute().Synchronize());
  EXPECT_THAT(Bytes(c.out_host), Each(15));
  // Same operations, streams, bytes, labels and (jittered) timing.
  EXPECT_EQ(StreamOps(*sim_, launch_from), StreamOps(*eager, eager_from));
  EXPECT_THAT(StreamOps(*sim_, launch_from), SizeIs(9));
  EXPECT_EQ(sim_->NowNs(), eager->NowNs());
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(SimGraphTest, SameCallsGiveTheSameTrace) {
  auto run = [](std::string* text) {
    std::unique_ptr<SimBackend> sim = NewSimBackend(Jittery());
    Chain c = MakeChain(*sim, 4 * kKiB);
    ASSERT_OK(sim->BeginCapture(sim->ComputeStream(), CaptureMode::kRelaxed));
    ASSERT_OK(EnqueueChain(*sim, c));
    ASSERT_OK_AND_ASSIGN(auto graph, sim->EndCapture(sim->ComputeStream()));
    ASSERT_OK_AND_ASSIGN(auto exec, sim->Instantiate(*graph));
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK(sim->Launch(*exec, sim->ComputeStream()));
    }
    sim->RunUntilIdle();
    *text = sim->TraceText();
  };
  std::string first, second;
  run(&first);
  run(&second);
  EXPECT_EQ(first, second);
  EXPECT_THAT(first, HasSubstr("graph-launch graph#1 launch 3 on 'compute'"));
}

TEST_F(SimGraphTest, EachLaunchReadsTheInputsOfItsTime) {
  const int64_t n = 16 * kKiB;
  Chain c = MakeChain(*sim_, n);
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(EnqueueChain(*sim_, c));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  graph.reset();  // the exec does not need it

  for (uint8_t input : {uint8_t{1}, uint8_t{100}}) {
    Fill(c.in_host, input);
    ASSERT_OK(sim_->Launch(*exec, compute()));
    ASSERT_OK(compute().Synchronize());
    EXPECT_THAT(Bytes(c.out_host), Each(input + 5));
  }
  // New bytes written straight into device memory between launches, with a
  // graph that starts at the kernel.
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(sim_->EnqueueKernel(compute(), AddKernel(c.in_dev, c.out_dev, 1)));
  ASSERT_OK(compute().Copy(c.out_host.data(), c.out_dev.data(), n));
  ASSERT_OK_AND_ASSIGN(graph, sim_->EndCapture(compute()));
  exec = Instantiate(*graph);
  for (uint8_t input : {uint8_t{7}, uint8_t{42}}) {
    ASSERT_OK_AND_ASSIGN(uint8_t * bytes, sim_->MutableBytes(c.in_dev.data(), n));
    std::memset(bytes, input, n);
    ASSERT_OK(sim_->Launch(*exec, compute()));
    ASSERT_OK(compute().Synchronize());
    EXPECT_THAT(Bytes(c.out_host), Each(input + 1));
  }
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

// The compute stream writes `dev`; a "d2h" stream joins through an event,
// copies it to pinned memory and is joined back.
TEST_F(SimGraphTest, SideStreamJoinsThroughAnEventAndIsJoinedBack) {
  const int64_t n = 32 * kKiB;
  Stream& d2h = NewStream("d2h");
  Buffer in = Device(n), dev = Device(n);
  Buffer host = Pinned(n);
  Fill(host, 0);
  ASSERT_OK_AND_ASSIGN(uint8_t * in_bytes, sim_->MutableBytes(in.data(), n));
  std::memset(in_bytes, 3, n);
  std::unique_ptr<Event> written = NewEvent(), copied = NewEvent();

  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(sim_->EnqueueKernel(compute(), AddKernel(in, dev, 1, 5000, "fwd")));
  ASSERT_OK(compute().Record(*written));
  EXPECT_FALSE(sim_->IsCapturing(d2h));
  ASSERT_OK(d2h.Wait(*written));
  EXPECT_TRUE(sim_->IsCapturing(d2h));
  ASSERT_OK(d2h.Copy(host.data(), dev.data(), n));
  ASSERT_OK(d2h.Record(*copied));
  ASSERT_OK(compute().Wait(*copied));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_FALSE(sim_->IsCapturing(d2h));
  EXPECT_EQ(graph->size(), 6);
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);

  const size_t from = sim_->trace().size();
  ASSERT_OK(sim_->Launch(*exec, compute()));
  // Work enqueued after the launch is ordered after all of it: overwriting
  // `dev` is no write-during-read of the replayed D2H copy.
  ASSERT_OK(sim_->EnqueueKernel(compute(), AddKernel(in, dev, 9, 10, "next")));
  ASSERT_OK(compute().Synchronize());
  EXPECT_THAT(Bytes(host), Each(4));
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  // The copy ran on the exec's own stream named "d2h", not on the user's.
  std::vector<std::string> ops = StreamOps(*sim_, from);
  EXPECT_THAT(ops, Contains(HasSubstr("end copy [d2h] 32768 B")));
  EXPECT_THAT(ops, Contains(HasSubstr("enqueue wait [compute] 0 B t=+0 on 'd2h'")));
  for (size_t i = from; i < sim_->trace().size(); ++i) {
    const SimTraceEntry& e = sim_->trace()[i];
    if (e.phase == SimPhase::kHost) continue;
    EXPECT_NE(e.stream, 1) << "user stream 'd2h' touched: " << e.ToString();
    if (e.kind == SimOpKind::kRecord || e.kind == SimOpKind::kWait) {
      EXPECT_NE(e.label, "event#1");  // user events are never touched
      EXPECT_NE(e.label, "event#2");
    }
  }
  // The user's events were last recorded by the capture: they never ran.
  EXPECT_THAT(written->Query(), StatusIs(StatusCode::kFailedPrecondition,
                                         HasSubstr("never ran")));
  EXPECT_THAT(d2h.Wait(*copied), StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(compute().Record(*written));
  EXPECT_THAT(written->Query(), IsOk());
  EXPECT_OK(d2h.Wait(*written));
  EXPECT_OK(d2h.Synchronize());
}

TEST_F(SimGraphTest, UnjoinedSideStreamFailsEndCaptureAndEndsIt) {
  const int64_t n = 4 * kKiB;
  Stream& d2h = NewStream("d2h");
  Buffer dev = Device(n);
  Buffer host = Pinned(n);
  Fill(host, 0);
  std::unique_ptr<Event> written = NewEvent(), copied = NewEvent();
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(compute().Record(*written));
  ASSERT_OK(d2h.Wait(*written));
  ASSERT_OK(d2h.Copy(host.data(), dev.data(), n));
  ASSERT_OK(d2h.Record(*copied));  // recorded, but compute never waits
  EXPECT_THAT(sim_->EndCapture(compute()),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'d2h'"), HasSubstr("unjoined"))));
  EXPECT_FALSE(sim_->IsCapturing(compute()));
  EXPECT_FALSE(sim_->IsCapturing(d2h));
  sim_->RunUntilIdle();
  EXPECT_EQ(Count(*sim_, SimPhase::kEnqueue, SimOpKind::kCopy), 0);
  EXPECT_THAT(d2h.Wait(*copied), StatusIs(StatusCode::kFailedPrecondition));
  // A new capture works, and a side stream that only waits needs no join.
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(compute().Record(*written));
  ASSERT_OK(d2h.Wait(*written));
  ASSERT_OK(compute().Copy(host.data(), dev.data(), n));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_EQ(graph->size(), 3);
}

TEST_F(SimGraphTest, TransitiveJoinThroughASecondSideStreamIsJoined) {
  const int64_t n = 4 * kKiB;
  Stream& a = NewStream("a");
  Stream& b = NewStream("b");
  Buffer dev = Device(n);
  Buffer host = Pinned(n);
  auto e1 = NewEvent(), e2 = NewEvent(), e3 = NewEvent();
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(compute().Record(*e1));
  ASSERT_OK(a.Wait(*e1));
  ASSERT_OK(a.Record(*e2));
  ASSERT_OK(b.Wait(*e2));
  ASSERT_OK(b.Copy(host.data(), dev.data(), n));
  ASSERT_OK(b.Record(*e3));
  ASSERT_OK(a.Wait(*e3));
  ASSERT_OK(a.Record(*e2));
  ASSERT_OK(compute().Wait(*e2));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  ASSERT_OK(sim_->Launch(*exec, compute()));
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(SimGraphTest, GraphMemoryIsAllocatedAndFreedByEachLaunch) {
  const int64_t n = 1 * kMiB;
  // The same calls eagerly, for the peak.
  int64_t eager_peak = 0;
  {
    std::unique_ptr<SimBackend> eager = NewSimBackend(SimOptions{});
    Chain c = MakeChain(*eager, n);
    eager->RunUntilIdle();
    eager->ResetPeaks();
    Stream& s = eager->ComputeStream();
    ASSERT_OK_AND_ASSIGN(Buffer tmp, eager->AllocateDevice(n, s));
    ASSERT_OK(s.Copy(tmp.data(), c.in_host.data(), n));
    ASSERT_OK(eager->EnqueueKernel(s, AddKernel(tmp, c.out_dev, 2)));
    ASSERT_OK(eager->Free(tmp, s));
    ASSERT_OK(s.Copy(c.out_host.data(), c.out_dev.data(), n));
    ASSERT_OK(s.Synchronize());
    eager_peak = eager->device_memory().peak_bytes;
  }

  Chain c = MakeChain(*sim_, n);
  sim_->RunUntilIdle();
  const SimMemoryStats before = sim_->device_memory();
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(Buffer tmp, sim_->AllocateDevice(n, compute()));
  void* const address = tmp.data();
  // Graph memory is usable by captured work only.
  Stream& other = NewStream("other");
  EXPECT_THAT(other.Copy(tmp.data(), c.in_host.data(), n),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("reserved")));
  EXPECT_THAT(sim_->MutableBytes(tmp.data(), n),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(compute().Copy(tmp.data(), c.in_host.data(), n));
  SimKernel kernel = AddKernel(tmp, c.out_dev, 2);
  std::vector<int64_t> live_in_kernel;
  kernel.body = [inner = kernel.body, &live_in_kernel](SimBackend& sim) {
    live_in_kernel.push_back(sim.device_memory().live_bytes);
    inner(sim);
  };
  ASSERT_OK(sim_->EnqueueKernel(compute(), std::move(kernel)));
  ASSERT_OK(sim_->Free(tmp, compute()));
  EXPECT_TRUE(tmp.empty());
  ASSERT_OK(compute().Copy(c.out_host.data(), c.out_dev.data(), n));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_EQ(graph->size(), 5);
  // The capture allocated nothing.
  EXPECT_EQ(sim_->device_memory().live_bytes, before.live_bytes);
  EXPECT_EQ(sim_->device_memory().allocations, before.allocations);
  EXPECT_THAT(sim_->MutableBytes(address, n),
              StatusIs(StatusCode::kFailedPrecondition));

  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  const size_t from = sim_->trace().size();
  sim_->ResetPeaks();
  for (uint8_t input : {uint8_t{20}, uint8_t{30}}) {
    Fill(c.in_host, input);
    ASSERT_OK(sim_->Launch(*exec, compute()));
    ASSERT_OK(compute().Synchronize());
    EXPECT_THAT(Bytes(c.out_host), Each(input + 2));
    EXPECT_EQ(sim_->device_memory().live_bytes, before.live_bytes);
  }
  EXPECT_EQ(sim_->device_memory().peak_bytes, eager_peak);
  EXPECT_EQ(sim_->device_memory().peak_bytes, before.live_bytes + n);
  EXPECT_THAT(live_in_kernel, ElementsAre(before.live_bytes + n,
                                          before.live_bytes + n));
  EXPECT_EQ(sim_->device_memory().allocations, before.allocations + 2);
  // Two allocations and two frees, each a new block, at the reserved address.
  std::vector<uint64_t> allocated, freed;
  for (size_t i = from; i < sim_->trace().size(); ++i) {
    const SimTraceEntry& e = sim_->trace()[i];
    if (e.phase != SimPhase::kEnqueue) continue;
    if (e.kind == SimOpKind::kAlloc) allocated.push_back(e.dst.block);
    if (e.kind == SimOpKind::kFree) freed.push_back(e.dst.block);
  }
  ASSERT_THAT(allocated, SizeIs(2));
  EXPECT_NE(allocated[0], allocated[1]);
  EXPECT_EQ(freed, allocated);
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  // After the launches the address holds a freed block: an eager copy into
  // it is a use-after-free, found by the detector.
  ASSERT_OK(other.Copy(address, c.in_host.data(), n));
  EXPECT_THAT(Kinds(sim_->hazards()), Contains(HazardKind::kUseAfterFree));
}

TEST_F(SimGraphTest, BackToBackLaunchesKeepEachLaunchsGraphMemory) {
  const int64_t n = 64 * kKiB;
  Chain c = MakeChain(*sim_, n);
  Buffer out2 = Pinned(n);
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(Buffer tmp, sim_->AllocateDevice(n, compute()));
  ASSERT_OK(compute().Copy(tmp.data(), c.in_host.data(), n));
  ASSERT_OK(sim_->EnqueueKernel(compute(), AddKernel(tmp, c.out_dev, 1)));
  ASSERT_OK(compute().Copy(c.out_host.data(), c.out_dev.data(), n));
  tmp = Buffer();  // ~Buffer on the capturing stream records the free
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  Fill(c.in_host, 50);
  // Two launches enqueued before either runs: the second one's block at
  // the same address must not take the first one's bytes.
  ASSERT_OK(sim_->Launch(*exec, compute()));
  ASSERT_OK(compute().Copy(out2.data(), c.out_host.data(), n));
  ASSERT_OK(sim_->Launch(*exec, compute()));
  exec.reset();  // destroyed while both launches are pending
  graph.reset();
  ASSERT_OK(compute().Synchronize());
  EXPECT_THAT(Bytes(out2), Each(51));
  EXPECT_THAT(Bytes(c.out_host), Each(51));
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(SimGraphTest, CapturedGatherIntoGraphMemoryReplaysTheView) {
  // A [16, 8] byte matrix; gather its transpose (shape [8, 16], strides
  // [1, 8]) into graph memory, then copy it out.
  const int64_t n = 128;
  Buffer src = Device(n);
  Buffer out = Pinned(n);
  Buffer staging = Pinned(n);
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK(compute().Copy(src.data(), staging.data(), n));
  ASSERT_OK_AND_ASSIGN(Buffer dense, sim_->AllocateDevice(n, compute()));
  EXPECT_THAT(compute().Gather(dense.data(), src.data(), 0, {8, 16}, {1, 8}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(compute().Gather(dense.data(), src.data(), 1, {8, 17}, {1, 8}),
              StatusIs(StatusCode::kInvalidArgument));  // outside `src`
  ASSERT_OK(compute().Gather(dense.data(), src.data(), 1, {8, 16}, {1, 8}));
  ASSERT_OK(compute().Copy(out.data(), dense.data(), n));
  ASSERT_OK(sim_->Free(dense, compute()));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_EQ(graph->size(), 5);
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  for (int launch = 0; launch < 2; ++launch) {
    auto* bytes = static_cast<uint8_t*>(staging.data());
    for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i + launch);
    ASSERT_OK(sim_->Launch(*exec, compute()));
    ASSERT_OK(compute().Synchronize());
    const auto* got = static_cast<const uint8_t*>(out.data());
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t j = 0; j < 16; ++j) {
        ASSERT_EQ(got[i * 16 + j], static_cast<uint8_t>(j * 8 + i + launch))
            << "launch " << launch << " element " << i << ", " << j;
      }
    }
  }
  EXPECT_EQ(Count(*sim_, SimPhase::kEnqueue, SimOpKind::kGather), 2);
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(SimGraphTest, GraphMemoryNotFreedInTheCaptureFailsInstantiate) {
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(Buffer tmp, sim_->AllocateDevice(4096, compute()));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_THAT(sim_->Instantiate(*graph),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("device#1"), HasSubstr("never freed"))));
  // Its buffer cannot be freed outside the capture: a clear error, and
  // dropping the handle does not crash.
  EXPECT_THAT(sim_->Free(tmp, compute()),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("capture has ended")));
  EXPECT_FALSE(tmp.empty());
  tmp = Buffer();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
}

TEST_F(SimGraphTest, LaunchThatCannotAllocateChangesNothing) {
  SimOptions options;
  options.device_capacity_bytes = 64 * kMiB;
  Make(options);
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  EXPECT_THAT(sim_->AllocateDevice(65 * kMiB, compute()),
              StatusIs(StatusCode::kResourceExhausted));
  ASSERT_OK_AND_ASSIGN(Buffer tmp, sim_->AllocateDevice(40 * kMiB, compute()));
  ASSERT_OK(sim_->Free(tmp, compute()));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  Buffer hog = Device(30 * kMiB);
  const size_t trace = sim_->trace().size();
  EXPECT_THAT(sim_->Launch(*exec, compute()),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("device#1")));
  EXPECT_EQ(sim_->trace().size(), trace);
  hog = Buffer();
  ASSERT_OK(sim_->Launch(*exec, compute()));
  ASSERT_OK(compute().Synchronize());
  EXPECT_EQ(sim_->device_memory().peak_bytes, 40 * kMiB);
}

TEST_F(SimGraphTest, RaceInTheCapturedOrderIsFoundAtReplayNotAtCapture) {
  const int64_t n = 16 * kKiB;
  Stream& d2h = NewStream("d2h");
  Buffer in = Device(n), dev = Device(n);
  Buffer host = Pinned(n);
  sim_->RunUntilIdle();
  std::unique_ptr<Event> too_early = NewEvent(), copied = NewEvent();
  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kGlobal));
  // The event is recorded before the kernel writes `dev`: the D2H copy is
  // not ordered after the write.
  ASSERT_OK(compute().Record(*too_early));
  ASSERT_OK(sim_->EnqueueKernel(compute(), AddKernel(in, dev, 1)));
  ASSERT_OK(d2h.Wait(*too_early));
  ASSERT_OK(d2h.Copy(host.data(), dev.data(), n));
  ASSERT_OK(d2h.Record(*copied));
  ASSERT_OK(compute().Wait(*copied));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  std::unique_ptr<GraphExec> exec = Instantiate(*graph);
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  ASSERT_OK(sim_->Launch(*exec, compute()));
  EXPECT_THAT(Kinds(sim_->hazards()),
              ElementsAre(HazardKind::kReadBeforeWrite));
  EXPECT_THAT(sim_->hazards()[0].later, HasSubstr("'d2h'"));
}

// The calls the interface refuses during a capture, and Launch on a
// capturing stream, are GraphConformanceTest's (testing/backend_conformance.cc,
// run on the simulator by sim_conformance_test). Particular to the
// simulator: it runs one capture at a time, so BeginCapture on a stream
// outside the capture is refused too; refused calls leave no trace; and the
// host still waits for eager work on streams outside the capture, in every
// mode (one host thread).
TEST_F(SimGraphTest, OneCaptureAtATimeWhileEagerWorkElsewhereRuns) {
  const int64_t n = 8 * kKiB;
  Stream& other = NewStream("other");
  Buffer in = Pinned(n), out = Pinned(n);
  Buffer dev = Device(n, &other);
  sim_->RunUntilIdle();
  std::unique_ptr<Event> eager = NewEvent();
  ASSERT_OK(sim_->BeginCapture(other, CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(auto empty, sim_->EndCapture(other));
  std::unique_ptr<GraphExec> exec = Instantiate(*empty);

  ASSERT_OK(sim_->BeginCapture(compute(), CaptureMode::kThreadLocal));
  const size_t trace = sim_->trace().size();
  EXPECT_THAT(sim_->BeginCapture(other, CaptureMode::kGlobal),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("one capture at a time")));
  EXPECT_THAT(sim_->Launch(*exec, compute()),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("captures")));
  EXPECT_EQ(sim_->trace().size(), trace);
  Fill(in, 60);
  ASSERT_OK(other.Copy(dev.data(), in.data(), n));
  ASSERT_OK(other.Copy(out.data(), dev.data(), n));
  ASSERT_OK(other.Record(*eager));
  EXPECT_OK(other.Synchronize());
  EXPECT_OK(eager->Synchronize());
  EXPECT_THAT(Bytes(out), Each(60));
  EXPECT_TRUE(sim_->IsCapturing(compute()));
  EXPECT_FALSE(sim_->IsCapturing(other));
  ASSERT_OK_AND_ASSIGN(auto graph, sim_->EndCapture(compute()));
  EXPECT_EQ(graph->size(), 0);
  EXPECT_OK(sim_->Launch(*exec, compute()));
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(SimGraphTest, ForeignObjectsAreRejected) {
  std::unique_ptr<SimBackend> other = NewSimBackend(SimOptions{});
  EXPECT_THAT(sim_->BeginCapture(other->ComputeStream(), CaptureMode::kGlobal),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(sim_->EndCapture(other->ComputeStream()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(sim_->EndCapture(compute()),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(other->BeginCapture(other->ComputeStream(), CaptureMode::kGlobal));
  ASSERT_OK_AND_ASSIGN(auto graph, other->EndCapture(other->ComputeStream()));
  EXPECT_THAT(sim_->Instantiate(*graph), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(auto exec, other->Instantiate(*graph));
  EXPECT_THAT(sim_->Launch(*exec, compute()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(other->Launch(*exec, compute()),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace offload
