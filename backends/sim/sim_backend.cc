#include "backends/sim/sim_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace offload {
namespace {

// Device addresses live in a non-canonical x86-64 range: the host faults if
// it ever dereferences one.
constexpr uintptr_t kDeviceAddressBase = uintptr_t{0x1000} << 48;
constexpr int64_t kDeviceAlignment = 256;

std::string Bytes(int64_t n) { return std::to_string(n) + " B"; }

}  // namespace

// ---------------------------------------------------------------------------
// Stream and Event handles: thin forwarders into the SimBackend.

class SimBackend::SimEvent final : public Event {
 public:
  SimEvent(SimBackend* sim, uint64_t id) : sim_(sim), id_(id) {}

  StatusOr<bool> Query() override {
    bool done = sim_->EventDone(*this);
    if (done) sim_->host_clock_.Join(clock_);  // the host has observed it
    return done;
  }

  Status Synchronize() override {
    sim_->SynchronizeEvent(*this);
    return OkStatus();
  }

  std::string Name() const { return "event#" + std::to_string(id_); }

  SimBackend* sim_;
  uint64_t id_;
  bool recorded_ = false;
  int stream_ = -1;     // where it was last recorded
  uint64_t count_ = 0;  // done once that stream completed this many ops
  VectorClock clock_;   // what the recording stream knew
};

class SimBackend::SimStream final : public Stream {
 public:
  SimStream(SimBackend* sim, int index, std::string name)
      : sim_(sim), index_(index), name_(std::move(name)) {}

  std::string_view name() const override { return name_; }

  Status Copy(void* dst, const void* src, int64_t bytes) override {
    return sim_->EnqueueCopy(index_, dst, src, bytes);
  }

  Status Gather(void* dst, const void* src, int64_t element_size,
                const std::vector<int64_t>& shape,
                const std::vector<int64_t>& strides) override {
    return sim_->EnqueueGather(index_, dst, src, element_size, shape, strides);
  }

  Status Record(Event& event) override {
    auto* sim_event = dynamic_cast<SimEvent*>(&event);
    if (sim_event == nullptr || sim_event->sim_ != sim_) {
      return InvalidArgumentError("Record on stream '" + name_ +
                                  "': the event belongs to another backend");
    }
    return sim_->RecordEvent(index_, *sim_event);
  }

  Status Wait(const Event& event) override {
    auto* sim_event = dynamic_cast<const SimEvent*>(&event);
    if (sim_event == nullptr || sim_event->sim_ != sim_) {
      return InvalidArgumentError("Wait on stream '" + name_ +
                                  "': the event belongs to another backend");
    }
    return sim_->WaitEvent(index_, *sim_event);
  }

  Status Synchronize() override {
    sim_->SynchronizeStream(index_);
    return OkStatus();
  }

  SimBackend* sim_;
  int index_;
  std::string name_;
};

// ---------------------------------------------------------------------------

SimBackend::SimBackend(const SimOptions& options)
    : options_(options),
      rng_state_(options.seed),
      next_device_address_(kDeviceAddressBase) {
  stats_[0].capacity_bytes = options_.device_capacity_bytes;
  stats_[1].capacity_bytes = options_.pinned_capacity_bytes;
  streams_.emplace_back();
  streams_[0].handle = std::make_unique<SimStream>(this, 0, "compute");
  streams_[0].name = "compute";
}

SimBackend::~SimBackend() = default;

std::unique_ptr<SimBackend> NewSimBackend(const SimOptions& options) {
  return std::make_unique<SimBackend>(options);
}

Stream& SimBackend::ComputeStream() { return *streams_[0].handle; }

StatusOr<Stream*> SimBackend::NewStream(std::string_view name) {
  int index = static_cast<int>(streams_.size());
  streams_.emplace_back();
  streams_.back().handle =
      std::make_unique<SimStream>(this, index, std::string(name));
  streams_.back().name = std::string(name);
  return static_cast<Stream*>(streams_.back().handle.get());
}

StatusOr<std::unique_ptr<Event>> SimBackend::NewEvent() {
  static_assert(sizeof(uint64_t) == 8);
  return std::unique_ptr<Event>(
      std::make_unique<SimEvent>(this, next_event_id_++));
}

bool SimBackend::OwnsStream(const Stream& stream) const {
  return StreamIndex(stream) >= 0;
}

int SimBackend::StreamIndex(const Stream& stream) const {
  auto* sim_stream = dynamic_cast<const SimStream*>(&stream);
  if (sim_stream == nullptr || sim_stream->sim_ != this) return -1;
  return sim_stream->index_;
}

// ---------------------------------------------------------------------------
// Memory.

SimBackend::Block& SimBackend::NewBlock(MemorySpace space, int64_t size) {
  Block block;
  block.id = next_block_id_++;
  block.space = space;
  block.size = size;
  if (space == MemorySpace::kDevice) {
    block.address = next_device_address_;
    // A gap after every block: an off-by-one range never lands in the next.
    next_device_address_ +=
        (size + 2 * kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    if (options_.store_bytes) {
      block.bytes.reset(new uint8_t[size]);
      std::memset(block.bytes.get(), kPoisonByte, size);
    }
  } else {
    // REQUIRES (checked by the caller): the allocation succeeded.
    block.bytes.reset(new (std::nothrow) uint8_t[size]);
    block.address = reinterpret_cast<uintptr_t>(block.bytes.get());
    // The host may hand out the address of a freed pinned block again: forget
    // stale records that overlap it.
    auto it = blocks_.lower_bound(block.address);
    if (it != blocks_.begin()) --it;
    while (it != blocks_.end() && it->first < block.address + size) {
      if (it->second.freed && it->second.bytes == nullptr &&
          it->first + it->second.size > block.address) {
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  uintptr_t address = block.address;
  return blocks_.emplace(address, std::move(block)).first->second;
}

StatusOr<SimBackend::Location> SimBackend::Resolve(const void* data,
                                                   int64_t bytes,
                                                   std::string_view role) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  auto it = blocks_.upper_bound(address);
  if (it != blocks_.begin()) {
    --it;
    Block& block = it->second;
    if (address - block.address + static_cast<uint64_t>(bytes) <=
        static_cast<uint64_t>(block.size)) {
      return Location{&block, static_cast<int64_t>(address - block.address)};
    }
  }
  return InvalidArgumentError(std::string(role) + " range of " + Bytes(bytes) +
                              " is not inside one allocation of this "
                              "simulated backend");
}

SimBackend::Block* SimBackend::FindBlock(uintptr_t address, uint64_t id) {
  auto it = blocks_.find(address);
  return it != blocks_.end() && it->second.id == id ? &it->second : nullptr;
}

void SimBackend::AddLive(MemorySpace space, int64_t delta) {
  SimMemoryStats& stats = stats_[SpaceIndex(space)];
  stats.live_bytes += delta;
  if (stats.live_bytes > stats.peak_bytes) {
    stats.peak_bytes = stats.live_bytes;
    stats.peak_time_ns = now_ns_;
  }
}

StatusOr<Buffer> SimBackend::AllocateDevice(int64_t bytes, Stream& stream) {
  int s = StreamIndex(stream);
  if (s < 0) {
    return InvalidArgumentError("AllocateDevice: stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  if (bytes <= 0) {
    return InvalidArgumentError("AllocateDevice on stream '" +
                                std::string(stream.name()) +
                                "': byte count must be positive, got " +
                                std::to_string(bytes));
  }
  // Memory whose free is still pending on this same stream is reusable: the
  // allocation is ordered after that free.
  int64_t available = options_.device_capacity_bytes - held_bytes_[0] +
                      pending_free_[0][s];
  if (bytes > available) {
    return ResourceExhaustedError(
        "AllocateDevice on stream '" + std::string(stream.name()) + "': " +
        Bytes(bytes) + " requested, " + Bytes(available) + " of " +
        Bytes(options_.device_capacity_bytes) +
        " device memory available to this stream");
  }
  Block& block = NewBlock(MemorySpace::kDevice, bytes);
  held_bytes_[0] += bytes;
  ++stats_[0].allocations;
  Op op;
  op.desc.kind = SimOpKind::kAlloc;
  op.desc.dst = block.Ref(0);
  op.desc.bytes = bytes;
  op.on_end = [this, bytes] { AddLive(MemorySpace::kDevice, bytes); };
  AccessOp ref = Enqueue(s, std::move(op), nullptr);
  detector_.OnAllocate(block.id, block.Name(), std::move(ref));
  return MakeBuffer(reinterpret_cast<void*>(block.address), bytes,
                    MemorySpace::kDevice, &stream);
}

StatusOr<Buffer> SimBackend::AllocatePinned(int64_t bytes) {
  if (bytes <= 0) {
    return InvalidArgumentError(
        "AllocatePinned: byte count must be positive, got " +
        std::to_string(bytes));
  }
  int64_t available = options_.pinned_capacity_bytes - held_bytes_[1];
  if (bytes > available) {
    return ResourceExhaustedError(
        "AllocatePinned: " + Bytes(bytes) + " requested, " + Bytes(available) +
        " of " + Bytes(options_.pinned_capacity_bytes) +
        " pinned memory available");
  }
  // Probe the host allocation before touching any state.
  std::unique_ptr<uint8_t[]> probe(new (std::nothrow) uint8_t[bytes]);
  if (probe == nullptr) {
    return ResourceExhaustedError("AllocatePinned: the host cannot provide " +
                                  Bytes(bytes));
  }
  probe.reset();
  Block& block = NewBlock(MemorySpace::kPinnedHost, bytes);
  if (block.bytes == nullptr) {
    blocks_.erase(block.address);
    return ResourceExhaustedError("AllocatePinned: the host cannot provide " +
                                  Bytes(bytes));
  }
  held_bytes_[1] += bytes;
  ++stats_[1].allocations;
  AddLive(MemorySpace::kPinnedHost, bytes);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kAlloc;
  desc.dst = block.Ref(0);
  desc.bytes = bytes;
  AccessOp ref = HostOp(std::move(desc));
  detector_.OnAllocate(block.id, block.Name(), std::move(ref));
  return MakeBuffer(block.bytes.get(), bytes, MemorySpace::kPinnedHost,
                    nullptr);
}

Status SimBackend::Release(void* data, int64_t size, MemorySpace space,
                           Stream* stream) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second.freed || it->second.size != size ||
      it->second.space != space) {
    return InvalidArgumentError("Free: " + Bytes(size) + " of " +
                                std::string(MemorySpaceName(space)) +
                                " memory is not a live allocation of this "
                                "simulated backend");
  }
  Block& block = it->second;
  int sp = SpaceIndex(space);
  if (stream == nullptr) {
    if (space == MemorySpace::kDevice) {
      return InvalidArgumentError("Free of " + block.Name() +
                                  ": device memory is freed on a stream");
    }
    block.freed = true;
    SimTraceEntry desc;
    desc.kind = SimOpKind::kFree;
    desc.dst = block.Ref(0);
    desc.bytes = size;
    AccessOp ref = HostOp(std::move(desc));
    detector_.OnFree(block.id, ref, host_clock_);
    held_bytes_[sp] -= size;
    AddLive(space, -size);
    block.bytes.reset();
    return OkStatus();
  }
  int s = StreamIndex(*stream);
  if (s < 0) {
    return InvalidArgumentError("Free of " + block.Name() + ": stream '" +
                                std::string(stream->name()) +
                                "' belongs to another backend");
  }
  block.freed = true;
  pending_free_[sp][s] += size;
  Op op;
  op.desc.kind = SimOpKind::kFree;
  op.desc.dst = block.Ref(0);
  op.desc.bytes = size;
  uint64_t id = block.id;
  op.on_end = [this, address, id, size, space, sp, s] {
    pending_free_[sp][s] -= size;
    held_bytes_[sp] -= size;
    AddLive(space, -size);
    if (Block* gone = FindBlock(address, id)) gone->bytes.reset();
  };
  VectorClock clock;
  AccessOp ref = Enqueue(s, std::move(op), &clock);
  detector_.OnFree(id, ref, clock);
  return OkStatus();
}

StatusOr<uint8_t*> SimBackend::MutableBytes(const void* data, int64_t bytes) {
  if (bytes < 0) return InvalidArgumentError("MutableBytes: negative size");
  OFFLOAD_ASSIGN_OR_RETURN(Location at, Resolve(data, bytes, "MutableBytes"));
  // The bytes exist until the free reaches its stream (device time).
  if (at.block->bytes == nullptr && at.block->freed) {
    return InvalidArgumentError("MutableBytes: " + at.block->Name() +
                                " has been freed");
  }
  if (at.block->bytes == nullptr) {
    return FailedPreconditionError("MutableBytes: " + at.block->Name() +
                                   " holds no bytes (store_bytes is false)");
  }
  return at.block->bytes.get() + at.offset;
}

// ---------------------------------------------------------------------------
// Stream work.

int64_t SimBackend::CopyDurationNs(MemorySpace dst, MemorySpace src,
                                   int64_t bytes) const {
  double gbps = options_.d2d_gbps;
  if (src == MemorySpace::kDevice && dst == MemorySpace::kPinnedHost) {
    gbps = options_.d2h_gbps;
  } else if (src == MemorySpace::kPinnedHost && dst == MemorySpace::kDevice) {
    gbps = options_.h2d_gbps;
  }
  // GB/s is bytes per nanosecond.
  return options_.copy_latency_ns +
         static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / gbps));
}

Status SimBackend::EnqueueCopy(int s, void* dst, const void* src,
                               int64_t bytes) {
  const std::string& name = streams_[s].name;
  if (bytes < 0) {
    return InvalidArgumentError("Copy on stream '" + name +
                                "': negative byte count " +
                                std::to_string(bytes));
  }
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError("Copy on stream '" + name +
                                "': null source or destination");
  }
  if (bytes == 0) return OkStatus();
  return EnqueueTransfer(
      s, /*gather=*/false, dst, src, bytes, bytes,
      [bytes](const uint8_t* source, uint8_t* staging) {
        std::memcpy(staging, source, bytes);
      });
}

Status SimBackend::EnqueueGather(int s, void* dst, const void* src,
                                 int64_t element_size,
                                 const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& strides) {
  OFFLOAD_RETURN_IF_ERROR(ValidateGather(streams_[s].name, dst, src,
                                         element_size, shape, strides));
  int64_t elements = 1, last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    elements *= shape[i];
    last += (shape[i] - 1) * strides[i];
  }
  if (elements == 0) return OkStatus();
  return EnqueueTransfer(
      s, /*gather=*/true, dst, src, elements * element_size,
      (last + 1) * element_size,
      [element_size, shape, strides](const uint8_t* source, uint8_t* staging) {
        ForEachContiguousRun(element_size, shape, strides,
                             [&](int64_t in, int64_t out, int64_t n) {
                               std::memcpy(staging + out, source + in, n);
                             });
      });
}

Status SimBackend::EnqueueTransfer(
    int s, bool gather, void* dst, const void* src, int64_t bytes,
    int64_t extent, std::function<void(const uint8_t*, uint8_t*)> read) {
  const std::string where = std::string(gather ? "Gather" : "Copy") +
                            " on stream '" + streams_[s].name + "'";
  auto from = Resolve(src, extent, where + ": source");
  if (!from.ok()) return from.status();
  auto to = Resolve(dst, bytes, where + ": destination");
  if (!to.ok()) return to.status();
  Block* from_block = from->block;
  Block* to_block = to->block;
  if (from_block == to_block && from->offset < to->offset + bytes &&
      to->offset < from->offset + extent) {
    return InvalidArgumentError(where + ": source and destination overlap in " +
                                to_block->Name());
  }
  Op op;
  op.desc.kind = gather ? SimOpKind::kGather : SimOpKind::kCopy;
  op.desc.src = from_block->Ref(from->offset);
  op.desc.dst = to_block->Ref(to->offset);
  op.desc.bytes = bytes;
  if (gather) {
    // A kernel on the stream's SMs, at device-to-device speed.
    op.duration_ns = Jitter(CopyDurationNs(MemorySpace::kDevice,
                                           MemorySpace::kDevice, bytes));
  } else {
    op.duration_ns =
        Jitter(CopyDurationNs(to_block->space, from_block->space, bytes));
    if (from_block->space == MemorySpace::kDevice &&
        to_block->space == MemorySpace::kPinnedHost) {
      op.engine = Engine::kD2H;
    } else if (from_block->space == MemorySpace::kPinnedHost &&
               to_block->space == MemorySpace::kDevice) {
      op.engine = Engine::kH2D;
    }
  }
  if (options_.store_bytes) {
    // It reads its source when it starts and writes its destination when it
    // ends: a racing reader or writer sees what it would on a GPU.
    auto staging = std::make_shared<std::vector<uint8_t>>();
    op.on_start = [this, staging, src_address = from_block->address,
                   src_id = from_block->id, src_offset = from->offset, bytes,
                   read = std::move(read)] {
      staging->assign(bytes, kLostByte);  // stays so if the source is gone
      Block* src_block = FindBlock(src_address, src_id);
      if (src_block != nullptr && src_block->bytes != nullptr) {
        read(src_block->bytes.get() + src_offset, staging->data());
      }
    };
    op.on_end = [this, staging, dst_address = to_block->address,
                 dst_id = to_block->id, dst_offset = to->offset, bytes] {
      Block* dst_block = FindBlock(dst_address, dst_id);
      if (dst_block != nullptr && dst_block->bytes != nullptr) {
        std::memcpy(dst_block->bytes.get() + dst_offset, staging->data(),
                    bytes);
      }
      staging->clear();
      staging->shrink_to_fit();
    };
  }
  uint64_t from_id = from_block->id, to_id = to_block->id;
  int64_t from_offset = from->offset, to_offset = to->offset;
  VectorClock clock;
  AccessOp ref = Enqueue(s, std::move(op), &clock);
  detector_.OnRead(from_id, from_offset, from_offset + extent, ref, clock);
  detector_.OnWrite(to_id, to_offset, to_offset + bytes, ref, clock);
  return OkStatus();
}

Status SimBackend::EnqueueKernel(Stream& stream, SimKernel kernel) {
  int s = StreamIndex(stream);
  if (s < 0) {
    return InvalidArgumentError("EnqueueKernel '" + kernel.name +
                                "': the stream belongs to another backend");
  }
  std::string where = "kernel '" + kernel.name + "' on stream '" +
                      std::string(stream.name()) + "'";
  if (kernel.duration_ns < 0) {
    return InvalidArgumentError(where + ": negative duration");
  }
  struct Access {
    uint64_t block;
    int64_t begin, end;
    bool write;
  };
  std::vector<Access> accesses;
  for (bool write : {false, true}) {
    for (const SimRange& range : write ? kernel.writes : kernel.reads) {
      if (range.data == nullptr || range.bytes <= 0) {
        return InvalidArgumentError(where + ": empty or null range");
      }
      auto at = Resolve(range.data, range.bytes,
                        where + (write ? ": written" : ": read"));
      if (!at.ok()) return at.status();
      accesses.push_back(
          Access{at->block->id, at->offset, at->offset + range.bytes, write});
    }
  }
  Op op;
  op.desc.kind = SimOpKind::kKernel;
  op.desc.label = kernel.name;
  op.duration_ns = Jitter(kernel.duration_ns);
  if (kernel.body) {
    op.on_end = [this, body = std::move(kernel.body)] { body(*this); };
  }
  VectorClock clock;
  AccessOp ref = Enqueue(s, std::move(op), &clock);
  for (const Access& access : accesses) {
    if (access.write) {
      detector_.OnWrite(access.block, access.begin, access.end, ref, clock);
    } else {
      detector_.OnRead(access.block, access.begin, access.end, ref, clock);
    }
  }
  return OkStatus();
}

Status SimBackend::RecordEvent(int s, SimEvent& event) {
  Op op;
  op.desc.kind = SimOpKind::kRecord;
  op.desc.label = event.Name();
  VectorClock clock;
  Enqueue(s, std::move(op), &clock);
  event.recorded_ = true;
  event.stream_ = s;
  event.count_ = streams_[s].enqueued;
  event.clock_ = std::move(clock);
  return OkStatus();
}

Status SimBackend::WaitEvent(int s, const SimEvent& event) {
  if (!event.recorded_) return OkStatus();  // CUDA: a no-op
  streams_[s].clock.Join(event.clock_);
  Op op;
  op.desc.kind = SimOpKind::kWait;
  op.desc.label = event.Name();
  op.desc.peer_stream = event.stream_;
  op.desc.peer_stream_name = streams_[event.stream_].name;
  op.wait_stream = event.stream_;
  op.wait_count = event.count_;
  Enqueue(s, std::move(op), nullptr);
  return OkStatus();
}

bool SimBackend::EventDone(const SimEvent& event) const {
  return !event.recorded_ ||
         streams_[event.stream_].completed >= event.count_;
}

void SimBackend::SynchronizeEvent(const SimEvent& event) {
  RunUntil([&] { return EventDone(event); }, -1);
  host_clock_.Join(event.clock_);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kSynchronizeEvent;
  desc.label = event.Name();
  if (event.recorded_) {
    desc.peer_stream = event.stream_;
    desc.peer_stream_name = streams_[event.stream_].name;
  }
  Trace(SimPhase::kHost, 0, -1, desc);
}

void SimBackend::SynchronizeStream(int s) {
  uint64_t target = streams_[s].enqueued;
  RunUntil([&] { return streams_[s].completed >= target; }, -1);
  host_clock_.Join(streams_[s].clock);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kSynchronizeStream;
  desc.peer_stream = s;
  desc.peer_stream_name = streams_[s].name;
  Trace(SimPhase::kHost, 0, -1, desc);
}

void SimBackend::RunUntilIdle() {
  RunUntil(
      [&] {
        for (const StreamState& st : streams_) {
          if (!st.queue.empty()) return false;
        }
        return true;
      },
      -1);
  for (const StreamState& st : streams_) host_clock_.Join(st.clock);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kSynchronizeDevice;
  Trace(SimPhase::kHost, 0, -1, desc);
}

void SimBackend::RunFor(int64_t ns) {
  if (ns <= 0) return;
  RunUntil([] { return false; }, now_ns_ + ns);
}

AccessOp SimBackend::Enqueue(int s, Op op, VectorClock* clock) {
  StreamState& st = streams_[s];
  st.clock.Join(host_clock_);  // ordered after everything the host did
  Epoch epoch = st.clock.Tick(Component(s));
  op.seq = next_seq_++;
  AccessOp ref{epoch, "op " + std::to_string(op.seq) + " " +
                          op.desc.Description() + " on '" + st.name + "'"};
  Trace(SimPhase::kEnqueue, op.seq, s, op.desc);
  if (clock != nullptr) *clock = st.clock;
  st.queue.push_back(std::move(op));
  ++st.enqueued;
  return ref;
}

AccessOp SimBackend::HostOp(SimTraceEntry desc) {
  Epoch epoch = host_clock_.Tick(0);
  Trace(SimPhase::kHost, 0, -1, desc);
  return AccessOp{epoch, "host " + desc.Description()};
}

// ---------------------------------------------------------------------------
// The event loop.

void SimBackend::RunUntil(const std::function<bool()>& done,
                          int64_t deadline_ns) {
  for (;;) {
    StartReadyWork();
    if (done()) return;
    // Every wait refers to work enqueued before it, so something is always
    // running while work remains; an empty set means nothing is left.
    if (running_.empty()) break;
    if (deadline_ns >= 0 && running_.top().end_ns > deadline_ns) break;
    CompleteNext();
  }
  if (deadline_ns > now_ns_) now_ns_ = deadline_ns;
}

void SimBackend::StartReadyWork() {
  bool progress = true;
  while (progress) {
    progress = false;
    // The operation waiting longest for each copy engine.
    int candidate[2] = {-1, -1};
    for (int s = 0; s < static_cast<int>(streams_.size()); ++s) {
      StreamState& st = streams_[s];
      while (!st.queue.empty() && !st.queue.front().running) {
        Op& op = st.queue.front();
        if (op.wait_stream >= 0 &&
            streams_[op.wait_stream].completed < op.wait_count) {
          break;
        }
        if (op.ready_ns < 0) op.ready_ns = now_ns_;
        if (op.engine == Engine::kNone) {
          if (op.duration_ns > 0) {
            Start(s, op);
            break;
          }
          Trace(SimPhase::kStart, op.seq, s, op.desc);
          if (op.on_start) op.on_start();
          Finish(s);  // zero duration: done at once
          progress = true;
          continue;
        }
        int e = static_cast<int>(op.engine);
        if (!engine_busy_[e]) {
          const Op* best = candidate[e] < 0
                               ? nullptr
                               : &streams_[candidate[e]].queue.front();
          if (best == nullptr || op.ready_ns < best->ready_ns ||
              (op.ready_ns == best->ready_ns && op.seq < best->seq)) {
            candidate[e] = s;
          }
        }
        break;
      }
    }
    for (int e = 0; e < 2; ++e) {
      if (candidate[e] < 0) continue;
      engine_busy_[e] = true;
      Start(candidate[e], streams_[candidate[e]].queue.front());
      progress = true;
    }
  }
}

void SimBackend::Start(int s, Op& op) {
  op.running = true;
  if (op.on_start) op.on_start();
  Trace(SimPhase::kStart, op.seq, s, op.desc);
  running_.push(Running{now_ns_ + op.duration_ns, op.seq, s});
}

void SimBackend::CompleteNext() {
  Running next = running_.top();
  running_.pop();
  now_ns_ = next.end_ns;
  Op& op = streams_[next.stream].queue.front();
  if (op.engine != Engine::kNone) engine_busy_[static_cast<int>(op.engine)] = false;
  Finish(next.stream);
}

void SimBackend::Finish(int s) {
  StreamState& st = streams_[s];
  Op op = std::move(st.queue.front());
  st.queue.pop_front();
  if (op.on_end) op.on_end();
  ++st.completed;
  Trace(SimPhase::kEnd, op.seq, s, op.desc);
}

int64_t SimBackend::Jitter(int64_t duration_ns) {
  if (options_.duration_jitter <= 0.0 || duration_ns == 0) return duration_ns;
  // A uniform double in [0, 1) from the top 53 bits.
  double u = static_cast<double>(NextRandom() >> 11) * 0x1.0p-53;
  double scale = 1.0 + options_.duration_jitter * (2.0 * u - 1.0);
  return std::max<int64_t>(
      0, std::llround(static_cast<double>(duration_ns) * scale));
}

uint64_t SimBackend::NextRandom() {
  // SplitMix64: small, fast, and the same on every platform.
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void SimBackend::Trace(SimPhase phase, uint64_t seq, int s,
                       const SimTraceEntry& desc) {
  if (!options_.record_trace) return;
  SimTraceEntry& entry = trace_.emplace_back(desc);
  entry.time_ns = now_ns_;
  entry.phase = phase;
  entry.seq = seq;
  entry.stream = s;
  entry.stream_name = s < 0 ? "host" : streams_[s].name;
}

std::string SimBackend::TraceText() const {
  std::string out;
  for (const SimTraceEntry& entry : trace_) {
    out += entry.ToString();
    out += '\n';
  }
  return out;
}

}  // namespace offload
