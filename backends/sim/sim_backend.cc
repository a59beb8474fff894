// SimBackend, part 1 of 5: construction, and what the host enqueues
// (copies, gathers, kernels, records, waits) or blocks on. The Stream and
// Event handles are in sim_handles.h, memory in sim_memory.cc, the event loop
// and the trace in sim_event_loop.cc, graph capture in sim_graph.cc and
// launch in sim_graph_launch.cc.

#include "backends/sim/sim_backend.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_handles.h"

namespace offload {
namespace {

// Device addresses live in a non-canonical x86-64 range: the host faults if
// it ever dereferences one.
constexpr uintptr_t kDeviceAddressBase = uintptr_t{0x1000} << 48;

}  // namespace

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
  int index = AddStream(std::string(name));
  return static_cast<Stream*>(streams_[index].handle.get());
}

int SimBackend::AddStream(std::string name) {
  int index = static_cast<int>(streams_.size());
  streams_.emplace_back();
  streams_.back().handle = std::make_unique<SimStream>(this, index, name);
  streams_.back().name = std::move(name);
  return index;
}

StatusOr<std::unique_ptr<Event>> SimBackend::NewEvent() {
  static_assert(sizeof(uint64_t) == 8);
  return std::unique_ptr<Event>(
      std::make_unique<SimEvent>(this, next_event_id_++));
}

bool SimBackend::OwnsEvent(const Event& event) const {
  const auto* sim_event = dynamic_cast<const SimEvent*>(&event);
  return sim_event != nullptr && sim_event->sim_ == this;
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
  if (CaptureSlot(s) >= 0) {
    GraphCall call;
    call.kind = GraphCall::Kind::kCopy;
    call.dst = dst;
    call.src = src;
    call.bytes = call.extent = bytes;
    return CaptureTransfer(s, std::move(call));
  }
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
  if (CaptureSlot(s) >= 0) {
    GraphCall call;
    call.kind = GraphCall::Kind::kGather;
    call.dst = dst;
    call.src = src;
    call.bytes = elements * element_size;
    call.extent = (last + 1) * element_size;
    call.element_size = element_size;
    call.shape = shape;
    call.strides = strides;
    return CaptureTransfer(s, std::move(call));
  }
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

StatusOr<std::pair<SimBackend::Location, SimBackend::Location>>
SimBackend::ResolveTransfer(int s, bool gather, void* dst, const void* src,
                            int64_t bytes, int64_t extent) {
  const std::string where = std::string(gather ? "Gather" : "Copy") +
                            " on stream '" + streams_[s].name + "'";
  OFFLOAD_ASSIGN_OR_RETURN(Location from,
                           Resolve(src, extent, where + ": source", s));
  OFFLOAD_ASSIGN_OR_RETURN(Location to,
                           Resolve(dst, bytes, where + ": destination", s));
  if (from.block == to.block && from.offset < to.offset + bytes &&
      to.offset < from.offset + extent) {
    return InvalidArgumentError(where + ": source and destination overlap in " +
                                to.block->Name());
  }
  return std::make_pair(from, to);
}

Status SimBackend::EnqueueTransfer(
    int s, bool gather, void* dst, const void* src, int64_t bytes,
    int64_t extent, std::function<void(const uint8_t*, uint8_t*)> read) {
  OFFLOAD_ASSIGN_OR_RETURN(auto locations,
                           ResolveTransfer(s, gather, dst, src, bytes, extent));
  const Location* from = &locations.first;
  const Location* to = &locations.second;
  Block* from_block = from->block;
  Block* to_block = to->block;
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
  return EnqueueKernelOn(s, std::move(kernel));
}

Status SimBackend::EnqueueKernelOn(int s, SimKernel kernel) {
  std::string where =
      "kernel '" + kernel.name + "' on stream '" + streams_[s].name + "'";
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
                        where + (write ? ": written" : ": read"), s);
      if (!at.ok()) return at.status();
      accesses.push_back(
          Access{at->block->id, at->offset, at->offset + range.bytes, write});
    }
  }
  if (CaptureSlot(s) >= 0) {
    SimTraceEntry desc;
    desc.kind = SimOpKind::kKernel;
    desc.label = kernel.name;
    GraphCall call;
    call.kind = GraphCall::Kind::kKernel;
    call.kernel = std::move(kernel);
    CaptureCall(s, std::move(call), desc);
    return OkStatus();
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
  if (CaptureSlot(s) >= 0) return RecordInCapture(s, event);
  Op op;
  op.desc.kind = SimOpKind::kRecord;
  op.desc.label = event.Name();
  VectorClock clock;
  Enqueue(s, std::move(op), &clock);
  event.recorded_ = true;
  event.captured_by_ = 0;
  event.capture_known_.clear();
  event.stream_ = s;
  event.count_ = streams_[s].enqueued;
  event.clock_ = std::move(clock);
  return OkStatus();
}

Status SimBackend::WaitEvent(int s, const SimEvent& event) {
  if (CaptureSlot(s) >= 0 || event.captured_by_ != 0) {
    return WaitInCapture(s, event);
  }
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

Status SimBackend::SynchronizeStream(int s) {
  if (CaptureSlot(s) >= 0) {
    return FailedPreconditionError("Synchronize of stream '" +
                                   streams_[s].name + "': " + CaptureWhere() +
                                   "; the host cannot wait for captured work");
  }
  uint64_t target = streams_[s].enqueued;
  RunUntil([&] { return streams_[s].completed >= target; }, -1);
  host_clock_.Join(streams_[s].clock);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kSynchronizeStream;
  desc.peer_stream = s;
  desc.peer_stream_name = streams_[s].name;
  Trace(SimPhase::kHost, 0, -1, desc);
  return OkStatus();
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

}  // namespace offload
