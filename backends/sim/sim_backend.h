// SimBackend: a deterministic simulated GPU behind the Backend interface.
//
// One thread, virtual time in integer nanoseconds, no wall clock anywhere.
// The host is infinitely fast: calls enqueue work at the current virtual time
// and return. Device time moves only when the host blocks (Event/Stream
// Synchronize, RunUntilIdle) or spends time (RunFor). Then the simulator runs
// stream work in virtual-time order; simultaneous happenings are ordered by
// the sequence number each operation got when it was enqueued, so a run is a
// pure function of the calls made and SimOptions::seed.
//
// The device model:
//  - Streams are FIFOs: one operation at a time, in enqueue order.
//  - One device-to-host and one host-to-device copy engine. A copy takes
//    copy_latency_ns + bytes / bandwidth. Copies of one direction serialize
//    (the engine goes to the operation that has waited longest, ties by
//    sequence number); the two directions and all kernels run concurrently.
//    Device-to-device and pinned-to-pinned copies, and Stream::Gather (one
//    operation per gather), use no engine and run at d2d_gbps.
//  - Kernels (EnqueueKernel) take the duration they are given and declare the
//    bytes they read and write; kernels on different streams run concurrently.
//  - Device and pinned memory have capacities and hold real bytes (unless
//    store_bytes is false). A copy reads its source when it starts and writes
//    its destination when it ends; a kernel's body runs when it ends. Fresh
//    device memory is filled with the poison byte 0xCD; bytes read from freed
//    memory arrive as 0xDE.
//  - Device addresses are not host pointers (dereferencing one faults) and
//    are never reused; pinned addresses are host pointers.
//  - A HazardDetector checks every access against the happens-before order
//    of streams, events and host synchronization (see hazard_detector.h).
//  - Memory statistics follow device time: an allocation counts from when its
//    stream reaches it, a free until its stream reaches it.
//
// Graph capture (engine/backend.h; sim_graph.cc): a capture records the
// calls made on its streams (copies, gathers, kernels, records, waits,
// device allocations and frees) with their arguments, validated as eagerly
// but not run and not checked for hazards. A launch re-issues the recorded
// calls in their original order through the eager paths, the origin's on
// the launch stream and a joined stream's on a replay stream of the exec
// (named like the captured stream), each captured event mapped to an event
// of the exec: a replay moves real bytes, takes time (jitter drawn at
// replay), counts memory and is checked for hazards exactly like the same
// calls made eagerly, and is traced like them (plus host entries for the
// capture and the launch, see sim_trace.h). Differences from CUDA:
//  - One capture at a time: BeginCapture while another capture runs is
//    kFailedPrecondition. The three CaptureModes behave alike (kGlobal).
//  - Device memory allocated in a capture is reserved at an address range of
//    its own that holds nothing until a launch allocates it there (each
//    launch a new block, with a new block id, at that address); it must be
//    freed in the capture (Instantiate fails otherwise), by a stream of the
//    capture. Freeing, on a capturing stream, device memory allocated outside
//    the capture is refused (kFailedPrecondition), as is freeing graph memory
//    anywhere but in its capture. Launches of graphs whose memory overlaps
//    in device time each get their own bytes; MutableBytes sees those of the
//    launch whose allocation ran last.
//  - A Buffer whose free is refused (pinned memory dropped during a capture,
//    or device memory allocated before the capture dropped while its stream
//    captures) keeps its memory allocated.
//
// Not thread-safe. All Buffers must be destroyed before the SimBackend.

#ifndef OFFLOAD_BACKENDS_SIM_SIM_BACKEND_H_
#define OFFLOAD_BACKENDS_SIM_SIM_BACKEND_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sim/hazard_detector.h"
#include "backends/sim/sim_options.h"
#include "backends/sim/sim_trace.h"
#include "backends/sim/vector_clock.h"
#include "engine/backend.h"
#include "engine/device_bytes_probe.h"
#include "engine/status.h"

namespace offload {

class SimBackend final : public Backend {
 public:
  explicit SimBackend(const SimOptions& options);
  ~SimBackend() override;
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  // Backend.
  Stream& ComputeStream() override;
  StatusOr<Stream*> NewStream(std::string_view name) override;
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  // As Backend::AllocateDevice. On a capturing stream the memory belongs to
  // the graph: the returned address range is reserved (it overlaps no other
  // allocation, and only work captured by this capture may use it) and holds
  // no bytes and no memory until a launch allocates it; freeing it on a
  // stream of the capture records the free. Errors as eagerly, except that
  // during a capture only `bytes` above the device capacity is
  // kResourceExhausted (the rest is checked at Launch).
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  // As Backend::AllocatePinned; kFailedPrecondition while a capture runs.
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

  // Enqueues `kernel` on `stream`; on a capturing stream, records it (with
  // its body and its duration before jitter) for the graph instead.
  // Errors: kInvalidArgument if the duration is negative, the stream is
  // foreign, or a range is not inside one allocation of this backend (during
  // a capture, memory reserved for it counts as allocated).
  Status EnqueueKernel(Stream& stream, SimKernel kernel);

  // Graph capture: the contract of engine/backend.h, with the simulator's
  // differences listed at the top of this file.
  bool SupportsGraphs() const override { return true; }
  bool IsCapturing(const Stream& stream) const override;
  // Makes `stream` the origin of a new capture. Success: `stream` captures.
  // Errors: kInvalidArgument for a foreign stream; kFailedPrecondition if
  // `stream` captures already or another capture runs (one at a time).
  Status BeginCapture(Stream& stream, CaptureMode mode) override;
  // Ends the capture whose origin is `stream`. Success: the graph of every
  // recorded call; no stream captures any more. Errors: kInvalidArgument
  // for a foreign stream; kFailedPrecondition if `stream` is not the origin
  // of the running capture (that capture goes on), or a joined stream has
  // captured work the origin does not wait for (the message names it): the
  // capture ends then, nothing it recorded ever runs, and events last
  // recorded in it stay refused until recorded again.
  StatusOr<std::unique_ptr<Graph>> EndCapture(Stream& stream) override;
  // Makes `graph` launchable: creates, once, the exec's replay streams (one
  // per joined stream, named like it) and events (one per captured event).
  // Errors: kInvalidArgument for a graph of another backend;
  // kFailedPrecondition if the graph allocates device memory it does not
  // free (the message names the block).
  StatusOr<std::unique_ptr<GraphExec>> Instantiate(const Graph& graph) override;
  // Re-issues the graph's calls, in their captured order, as eager calls: the
  // origin's on `stream`, the others on the exec's replay streams, each
  // captured event replaced by the exec's own (user events are never
  // touched). Adds a host trace entry (kGraphLaunch) first. Success: all of
  // it is enqueued. Errors (nothing enqueued): kInvalidArgument for a
  // foreign exec or stream; kFailedPrecondition if `stream` captures, or a
  // range the graph uses (outside its own memory) is no longer inside an
  // allocation; kResourceExhausted if the graph's device allocations would
  // fail now.
  Status Launch(GraphExec& exec, Stream& stream) override;

  // Current virtual time.
  int64_t NowNs() const { return now_ns_; }
  // Blocks the host until every stream is idle (cudaDeviceSynchronize).
  void RunUntilIdle();
  // The host spends `ns` of virtual time; the device keeps running meanwhile.
  void RunFor(int64_t ns);

  // The simulated bytes of [data, data + bytes), for kernel bodies and tests.
  // Bypasses the hazard detector and stream order. Errors: kInvalidArgument
  // if the range is not inside one live allocation, kFailedPrecondition if
  // store_bytes is false for device memory or the range is graph memory not
  // allocated at this device time (reserved by a capture, or between
  // launches).
  StatusOr<uint8_t*> MutableBytes(const void* data, int64_t bytes);

  // Hazards found so far (empty for a correct program).
  const std::vector<Hazard>& hazards() const { return detector_.hazards(); }
  SimMemoryStats device_memory() const { return stats_[0]; }
  SimMemoryStats pinned_memory() const { return stats_[1]; }
  // Starts a new high-water mark of both memories from their live bytes
  // now (e.g. to measure one iteration after a warm-up).
  void ResetPeaks() {
    for (SimMemoryStats& stats : stats_) {
      stats.peak_bytes = stats.live_bytes;
      stats.peak_time_ns = now_ns_;
    }
  }
  // Device bytes in use in host order: allocated through this backend (by
  // the engine or the workload) and not yet handed to a Free call, as a
  // framework allocator counts them (device_memory() counts in device time,
  // where a free takes effect when its stream reaches it).
  int64_t DeviceBytesInUse() const;
  // A probe of DeviceBytesInUse for OffloadOptions::device_bytes_probe
  // (SPEC §4.7), with a high-water mark of its own (ResetPeaks leaves it
  // alone). Lives as long as the backend.
  DeviceBytesProbe& InUseProbe() { return in_use_probe_; }
  // Everything that happened so far, in order (see sim_trace.h); empty if
  // SimOptions::record_trace is false.
  const std::vector<SimTraceEntry>& trace() const { return trace_; }
  // The whole trace, one entry's ToString() per line.
  std::string TraceText() const;
  const SimOptions& options() const { return options_; }

  // Duration of a copy in the given direction without jitter.
  int64_t CopyDurationNs(MemorySpace dst, MemorySpace src,
                         int64_t bytes) const;

 protected:
  Status Release(void* data, int64_t size, MemorySpace space,
                 Stream* stream) override;
  bool OwnsStream(const Stream& stream) const override;
  bool OwnsEvent(const Event& event) const override;

 private:
  class SimStream;
  class SimEvent;
  class SimGraph;
  class SimGraphExec;
  friend class SimStream;
  friend class SimEvent;

  enum class Engine { kNone = -1, kD2H = 0, kH2D = 1 };

  static constexpr uint8_t kPoisonByte = 0xCD;  // fresh device memory
  static constexpr uint8_t kLostByte = 0xDE;    // bytes read from freed memory

  struct Block {
    uint64_t id = 0;
    MemorySpace space = MemorySpace::kDevice;
    uintptr_t address = 0;
    int64_t size = 0;
    std::unique_ptr<uint8_t[]> bytes;  // null when freed or not stored
    bool freed = false;                // Free called (host order)
    // Graph memory: the id of the capture that allocated it. `reserved`: the
    // capture's reservation (no bytes, not live, unknown to the detector);
    // otherwise a launch's allocation at that address.
    uint64_t graph = 0;
    bool reserved = false;
    std::string Name() const { return Ref(0).BlockName(); }
    SimBlockRef Ref(int64_t offset) const { return {id, space, offset}; }
  };

  // Where an address points.
  struct Location {
    Block* block = nullptr;
    int64_t offset = 0;
  };

  struct Op {
    uint64_t seq = 0;
    // What the trace says about it: kind, blocks, bytes, label, peer stream
    // (time, phase, sequence number and stream are filled in by Trace).
    SimTraceEntry desc;
    int64_t duration_ns = 0;
    Engine engine = Engine::kNone;
    int wait_stream = -1;      // kWait: stream and count it waits for
    uint64_t wait_count = 0;
    std::function<void()> on_start;  // effects applied when it starts
    std::function<void()> on_end;    // effects applied at completion
    int64_t ready_ns = -1;
    bool running = false;
  };

  struct StreamState {
    std::unique_ptr<SimStream> handle;
    std::string name;  // the handle's, for the trace
    std::deque<Op> queue;
    uint64_t enqueued = 0;   // operations enqueued so far
    uint64_t completed = 0;  // operations completed so far (FIFO prefix)
    VectorClock clock;
  };

  struct Running {
    int64_t end_ns;
    uint64_t seq;
    int stream;
    bool operator>(const Running& o) const {
      return end_ns != o.end_ns ? end_ns > o.end_ns : seq > o.seq;
    }
  };

  // A call recorded by a capture (sim_graph.cc), re-issued by each launch.
  struct GraphCall {
    enum class Kind { kCopy, kGather, kKernel, kRecord, kWait, kAlloc, kFree };
    Kind kind = Kind::kCopy;
    int slot = 0;  // the capture's stream (0: the origin)
    // Copy and gather: as given; bytes written and bytes read (extent).
    void* dst = nullptr;
    const void* src = nullptr;
    int64_t bytes = 0;
    int64_t extent = 0;
    int64_t element_size = 0;  // gather
    std::vector<int64_t> shape, strides;
    SimKernel kernel;  // kernel, with its duration before jitter
    int index = -1;    // record, wait: event index; alloc, free: block index
  };
  // Device memory allocated in a capture.
  struct GraphBlock {
    uintptr_t address = 0;
    int64_t size = 0;
    std::string name;  // the reservation's, e.g. "device#4"
    int slot = 0;      // allocating stream
    bool freed = false;
  };
  // What a capture recorded; shared by its Graph and every GraphExec.
  struct GraphData {
    uint64_t id = 0;  // the capture's id: "graph#<id>"
    std::vector<std::string> stream_names;  // by slot
    std::vector<std::string> event_names;   // by event index
    std::vector<GraphCall> calls;
    std::vector<GraphBlock> blocks;
    std::string Name() const { return "graph#" + std::to_string(id); }
  };
  // The running capture.
  struct CaptureState {
    uint64_t id = 0;
    CaptureMode mode = CaptureMode::kGlobal;
    std::shared_ptr<GraphData> data;
    std::vector<int> streams;  // stream index by slot; [0] the origin
    // known[k][j]: how many work calls (not records or waits) of slot j the
    // work slot k captures next is ordered after; known[k][k] is k's own.
    std::vector<std::vector<int64_t>> known;
    std::map<uint64_t, int> events;  // event id -> event index
  };

  // Stream and event plumbing.
  int StreamIndex(const Stream& stream) const;
  int AddStream(std::string name);
  static size_t Component(int stream) { return static_cast<size_t>(stream) + 1; }
  Status EnqueueCopy(int stream, void* dst, const void* src, int64_t bytes);
  Status EnqueueGather(int stream, void* dst, const void* src,
                       int64_t element_size, const std::vector<int64_t>& shape,
                       const std::vector<int64_t>& strides);
  // What Copy and Gather share: reads `extent` bytes at `src` (through
  // `read`, which fills `bytes` of staging) and writes `bytes` at `dst`.
  Status EnqueueTransfer(int stream, bool gather, void* dst, const void* src,
                         int64_t bytes, int64_t extent,
                         std::function<void(const uint8_t*, uint8_t*)> read);
  // Resolves both ranges of a copy or gather and checks they do not
  // overlap.
  StatusOr<std::pair<Location, Location>> ResolveTransfer(
      int stream, bool gather, void* dst, const void* src, int64_t bytes,
      int64_t extent);
  Status EnqueueKernelOn(int stream, SimKernel kernel);
  Status RecordEvent(int stream, SimEvent& event);
  Status WaitEvent(int stream, const SimEvent& event);
  Status SynchronizeStream(int stream);
  void SynchronizeEvent(const SimEvent& event);
  bool EventDone(const SimEvent& event) const;
  // kFailedPrecondition if the event's last record was captured (it has not
  // run, or never will); `call` names the refused call.
  Status CheckEventRan(const SimEvent& event, std::string_view call) const;

  // Capture (sim_graph.cc). The capture's slot of `stream`, -1 if it does
  // not capture.
  int CaptureSlot(int stream) const;
  // Records `call` on capturing `stream`; `desc` says what for the trace.
  void CaptureCall(int stream, GraphCall call, const SimTraceEntry& desc);
  Status CaptureTransfer(int stream, GraphCall call);
  Status RecordInCapture(int stream, SimEvent& event);
  // Wait when `stream` captures or the event was recorded in a capture.
  Status WaitInCapture(int stream, const SimEvent& event);
  StatusOr<Buffer> AllocateInCapture(int stream, Stream& handle,
                                     int64_t bytes);
  // Release of graph memory (a reservation or a launch's block).
  Status ReleaseGraphMemory(Block& block, Stream* stream);
  // Launch (sim_graph_launch.cc): the checks it makes before enqueueing
  // anything.
  Status CheckLaunch(const GraphData& graph, const std::vector<int>& streams);
  Status CheckReplayRange(const GraphData& graph, const void* data,
                          int64_t bytes, const std::string& role);
  // Re-issues one recorded call on `stream`.
  Status Replay(const GraphCall& call, int stream, SimGraphExec& exec);
  // What a refused call during the capture says about it.
  std::string CaptureWhere() const;

  // Stamps and enqueues `op` on `stream`; returns its epoch and clock.
  AccessOp Enqueue(int stream, Op op, VectorClock* clock);
  // Traces `desc` as a host entry; returns its epoch on the host's clock.
  AccessOp HostOp(SimTraceEntry desc);

  // The event loop.
  // Runs device work until `done()` holds or, if deadline_ns >= 0, until
  // that virtual time; then the host resumes at the later of now and the
  // deadline.
  void RunUntil(const std::function<bool()>& done, int64_t deadline_ns);
  void StartReadyWork();
  void Start(int stream, Op& op);
  void CompleteNext();
  void Finish(int stream);
  int64_t Jitter(int64_t duration_ns);
  uint64_t NextRandom();

  // Memory.
  // The allocation holding [data, data + bytes). `stream` is the stream of
  // the access (-1: the host): memory reserved by a capture resolves only
  // for its capturing streams.
  StatusOr<Location> Resolve(const void* data, int64_t bytes,
                             std::string_view role, int stream);
  // A fresh device address range of `size` bytes (never handed out again).
  uintptr_t ReserveDeviceAddress(int64_t size);
  // A new block; device blocks at a fresh address, or at `address` if set
  // (a launch's allocation of graph memory, replacing what was there).
  Block& NewBlock(MemorySpace space, int64_t size, uintptr_t address = 0);
  // The stream-ordered allocation of `bytes` on `stream`; with `graph` set,
  // a launch's block of that graph's memory at `address`. REQUIRES: the
  // capacity checks passed.
  Block& EnqueueAllocation(int stream, int64_t bytes, uintptr_t address = 0,
                           uint64_t graph = 0);
  // The stream-ordered free of `block` on `stream`.
  void EnqueueFree(Block& block, int stream);
  // Device bytes an allocation on `stream` may have now.
  int64_t DeviceAvailable(int stream) {
    return options_.device_capacity_bytes - held_bytes_[0] +
           pending_free_[0][stream];
  }
  // The block that started at `address` with that id, if still known.
  Block* FindBlock(uintptr_t address, uint64_t id);
  void AddLive(MemorySpace space, int64_t delta);
  int SpaceIndex(MemorySpace space) const {
    return space == MemorySpace::kDevice ? 0 : 1;
  }

  // Appends `desc` to the trace as happening now, with the given phase,
  // sequence number and stream (-1: the host).
  void Trace(SimPhase phase, uint64_t seq, int stream,
             const SimTraceEntry& desc);

  const SimOptions options_;
  int64_t now_ns_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t rng_state_;

  std::vector<StreamState> streams_;
  VectorClock host_clock_;
  std::priority_queue<Running, std::vector<Running>, std::greater<Running>>
      running_;
  bool engine_busy_[2] = {false, false};

  std::map<uintptr_t, Block> blocks_;  // by start address
  // Launch blocks of graph memory replaced at their address by a later
  // launch before their free ran, by id (FindBlock looks here too).
  std::map<uint64_t, Block> superseded_;
  // Graph memory allocated in device time: address -> the block whose
  // allocation ran last and whose free has not (what MutableBytes sees).
  std::map<uintptr_t, uint64_t> graph_live_;
  std::unique_ptr<CaptureState> capture_;  // null: no capture runs
  uint64_t next_capture_id_ = 1;
  uint64_t next_block_id_ = 1;
  uint64_t next_event_id_ = 1;
  uintptr_t next_device_address_;
  // Bytes not yet returned in device time, per space; and of those, bytes
  // whose free is enqueued on a stream but not yet reached, per stream.
  int64_t held_bytes_[2] = {0, 0};
  std::map<int, int64_t> pending_free_[2];
  SimMemoryStats stats_[2];

  HazardDetector detector_;
  std::vector<SimTraceEntry> trace_;

  // InUseProbe: DeviceBytesInUse and its high-water mark, raised at each
  // allocation (frees only lower the count).
  class InUseProbeImpl final : public DeviceBytesProbe {
   public:
    explicit InUseProbeImpl(const SimBackend& sim) : sim_(sim) {}
    int64_t InUseBytes() override { return sim_.DeviceBytesInUse(); }
    int64_t TakePeakBytes() override {
      const int64_t now = sim_.DeviceBytesInUse();
      const int64_t peak = peak_ > now ? peak_ : now;
      peak_ = now;
      return peak;
    }
    void Note(int64_t in_use) {
      if (in_use > peak_) peak_ = in_use;
    }

   private:
    const SimBackend& sim_;
    int64_t peak_ = 0;
  };
  InUseProbeImpl in_use_probe_{*this};
};

std::unique_ptr<SimBackend> NewSimBackend(const SimOptions& options);

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_SIM_BACKEND_H_
