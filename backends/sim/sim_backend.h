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
#include <vector>

#include "backends/sim/hazard_detector.h"
#include "backends/sim/sim_trace.h"
#include "backends/sim/vector_clock.h"
#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

struct SimOptions {
  uint64_t seed = 0;
  double d2h_gbps = 55.0, h2d_gbps = 55.0;  // per direction, one engine each
  int64_t copy_latency_ns = 2000;
  int64_t device_capacity_bytes = int64_t{80} << 30;
  int64_t pinned_capacity_bytes = int64_t{512} << 30;
  // Device-to-device (and pinned-to-pinned) copy bandwidth; no engine.
  double d2d_gbps = 2000.0;
  // Each copy and kernel duration is scaled by 1 + u, u drawn uniformly from
  // [-duration_jitter, +duration_jitter] by the seeded RNG. 0 = exact.
  double duration_jitter = 0.0;
  // false: device memory holds no bytes and copies move none; for timing
  // runs of workloads too large to hold in host RAM.
  bool store_bytes = true;
  // false: trace() stays empty (long property runs).
  bool record_trace = true;
};

// A byte range of simulated memory.
struct SimRange {
  const void* data = nullptr;
  int64_t bytes = 0;
};

class SimBackend;

// Device work of a fixed duration, standing in for a model's kernels.
struct SimKernel {
  std::string name;
  int64_t duration_ns = 0;
  std::vector<SimRange> reads;
  std::vector<SimRange> writes;
  // Runs when the kernel completes in device time; may change simulated
  // bytes through SimBackend::MutableBytes. Optional.
  std::function<void(SimBackend&)> body;
};

struct SimMemoryStats {
  int64_t live_bytes = 0;     // allocated and not freed, in device time
  int64_t peak_bytes = 0;     // high-water mark of live_bytes
  int64_t peak_time_ns = 0;   // when the high-water mark was first reached
  int64_t capacity_bytes = 0;
  int64_t allocations = 0;    // number of allocations so far
};

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
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

  // Enqueues `kernel` on `stream`. Errors: kInvalidArgument if the duration
  // is negative, the stream is foreign, or a range is not inside one
  // allocation of this backend.
  Status EnqueueKernel(Stream& stream, SimKernel kernel);

  // Current virtual time.
  int64_t NowNs() const { return now_ns_; }
  // Blocks the host until every stream is idle (cudaDeviceSynchronize).
  void RunUntilIdle();
  // The host spends `ns` of virtual time; the device keeps running meanwhile.
  void RunFor(int64_t ns);

  // The simulated bytes of [data, data + bytes), for kernel bodies and tests.
  // Bypasses the hazard detector and stream order. Errors: kInvalidArgument
  // if the range is not inside one live allocation, kFailedPrecondition if
  // store_bytes is false for device memory.
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

  // Stream and event plumbing.
  int StreamIndex(const Stream& stream) const;
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
  Status RecordEvent(int stream, SimEvent& event);
  Status WaitEvent(int stream, const SimEvent& event);
  void SynchronizeStream(int stream);
  void SynchronizeEvent(const SimEvent& event);
  bool EventDone(const SimEvent& event) const;

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
  StatusOr<Location> Resolve(const void* data, int64_t bytes,
                             std::string_view role);
  Block& NewBlock(MemorySpace space, int64_t size);
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
};

std::unique_ptr<SimBackend> NewSimBackend(const SimOptions& options);

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_SIM_BACKEND_H_
