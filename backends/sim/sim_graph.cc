// SimBackend, part 4 of 5: graph capture (the optional capability of
// engine/backend.h); the launch is part 5, sim_graph_launch.cc.
//
// A capture records calls, not operations: each GraphCall holds the
// arguments of one Copy, Gather, EnqueueKernel, Record, Wait, allocation or
// free made on a capturing stream, validated as the eager call would be. A
// launch re-issues them, in their captured order, through the eager paths of
// sim_backend.cc and sim_memory.cc, so that a replay moves bytes, takes
// time, counts memory and is checked for hazards exactly like the same calls
// made eagerly.
//
// Joins: known[k][j] counts the work calls (copies, gathers, kernels,
// allocations, frees) of slot j that the next work of slot k is ordered
// after. A Record copies its stream's vector into the event; a Wait takes
// the element-wise maximum. At EndCapture the origin must know all the work
// of every joined stream.

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "backends/sim/sim_handles.h"

namespace offload {
namespace {

void JoinKnown(std::vector<int64_t>& into, const std::vector<int64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t j = 0; j < from.size(); ++j) into[j] = std::max(into[j], from[j]);
}

int64_t KnownOf(const std::vector<int64_t>& known, size_t slot) {
  return slot < known.size() ? known[slot] : 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Capture state.

bool SimBackend::IsCapturing(const Stream& stream) const {
  int s = StreamIndex(stream);
  return s >= 0 && CaptureSlot(s) >= 0;
}

int SimBackend::CaptureSlot(int s) const {
  if (capture_ == nullptr) return -1;
  const std::vector<int>& streams = capture_->streams;
  auto it = std::find(streams.begin(), streams.end(), s);
  return it == streams.end() ? -1 : static_cast<int>(it - streams.begin());
}

std::string SimBackend::CaptureWhere() const {
  return "the capture of " + capture_->data->Name() + " (origin '" +
         streams_[capture_->streams[0]].name + "') is in progress";
}

void SimBackend::CaptureCall(int s, GraphCall call, const SimTraceEntry& desc) {
  const int slot = CaptureSlot(s);
  call.slot = slot;
  if (call.kind != GraphCall::Kind::kRecord &&
      call.kind != GraphCall::Kind::kWait) {
    std::vector<int64_t>& known = capture_->known[slot];
    if (known.size() <= static_cast<size_t>(slot)) known.resize(slot + 1, 0);
    ++known[slot];
  }
  SimTraceEntry entry;
  entry.kind = SimOpKind::kCapture;
  entry.label = desc.Description();
  entry.src = desc.src;
  entry.dst = desc.dst;
  entry.bytes = desc.bytes;
  entry.peer_stream = s;
  entry.peer_stream_name = streams_[s].name;
  Trace(SimPhase::kHost, 0, -1, entry);
  capture_->data->calls.push_back(std::move(call));
}

Status SimBackend::CheckEventRan(const SimEvent& event,
                                 std::string_view call) const {
  if (event.captured_by_ == 0) return OkStatus();
  const std::string what = std::string(call) + " of " + event.Name() + ": ";
  const std::string graph = "graph#" + std::to_string(event.captured_by_);
  if (capture_ != nullptr && capture_->id == event.captured_by_) {
    return FailedPreconditionError(
        what + "its last record (on stream '" +
        streams_[event.capture_stream_].name + "') is in the capture of " +
        graph + ", in progress; captured work runs only when launched");
  }
  return FailedPreconditionError(
      what + "its last record was captured by " + graph +
      ", whose capture has ended, and never ran; record it again first");
}

// ---------------------------------------------------------------------------
// Captured calls.

Status SimBackend::CaptureTransfer(int s, GraphCall call) {
  const bool gather = call.kind == GraphCall::Kind::kGather;
  OFFLOAD_ASSIGN_OR_RETURN(
      auto at,
      ResolveTransfer(s, gather, call.dst, call.src, call.bytes, call.extent));
  SimTraceEntry desc;
  desc.kind = gather ? SimOpKind::kGather : SimOpKind::kCopy;
  desc.src = at.first.block->Ref(at.first.offset);
  desc.dst = at.second.block->Ref(at.second.offset);
  desc.bytes = call.bytes;
  CaptureCall(s, std::move(call), desc);
  return OkStatus();
}

Status SimBackend::RecordInCapture(int s, SimEvent& event) {
  const int slot = CaptureSlot(s);
  GraphData& data = *capture_->data;
  auto [it, added] = capture_->events.emplace(
      event.id_, static_cast<int>(data.event_names.size()));
  if (added) data.event_names.push_back(event.Name());
  event.captured_by_ = capture_->id;
  event.capture_stream_ = s;
  event.capture_known_ = capture_->known[slot];
  GraphCall call;
  call.kind = GraphCall::Kind::kRecord;
  call.index = it->second;
  SimTraceEntry desc;
  desc.kind = SimOpKind::kRecord;
  desc.label = event.Name();
  CaptureCall(s, std::move(call), desc);
  return OkStatus();
}

Status SimBackend::WaitInCapture(int s, const SimEvent& event) {
  int slot = CaptureSlot(s);
  const std::string where =
      "Wait on stream '" + streams_[s].name + "' for " + event.Name() + ": ";
  if (event.captured_by_ == 0) {  // here the stream captures
    if (!event.recorded_) return OkStatus();  // CUDA: a no-op
    return FailedPreconditionError(
        where + "the stream captures (" + capture_->data->Name() +
        ") and the event was recorded outside the capture; only in-stream "
        "order crosses a capture's boundary");
  }
  if (capture_ == nullptr || capture_->id != event.captured_by_) {
    return CheckEventRan(event, "Wait on stream '" + streams_[s].name + "'");
  }
  if (slot < 0) {  // the stream joins the capture
    slot = static_cast<int>(capture_->streams.size());
    capture_->streams.push_back(s);
    capture_->known.emplace_back();
    capture_->data->stream_names.push_back(streams_[s].name);
  }
  JoinKnown(capture_->known[slot], event.capture_known_);
  GraphCall call;
  call.kind = GraphCall::Kind::kWait;
  call.index = capture_->events.at(event.id_);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kWait;
  desc.label = event.Name();
  desc.peer_stream = event.capture_stream_;
  desc.peer_stream_name = streams_[event.capture_stream_].name;
  CaptureCall(s, std::move(call), desc);
  return OkStatus();
}

StatusOr<Buffer> SimBackend::AllocateInCapture(int s, Stream& handle,
                                               int64_t bytes) {
  if (bytes > options_.device_capacity_bytes) {
    return ResourceExhaustedError(
        "AllocateDevice on stream '" + streams_[s].name + "' (capturing " +
        capture_->data->Name() + "): " + std::to_string(bytes) +
        " B requested, more than the device capacity of " +
        std::to_string(options_.device_capacity_bytes) + " B");
  }
  Block reservation;
  reservation.id = next_block_id_++;
  reservation.space = MemorySpace::kDevice;
  reservation.size = bytes;
  reservation.address = ReserveDeviceAddress(bytes);
  reservation.graph = capture_->id;
  reservation.reserved = true;
  GraphData& data = *capture_->data;
  GraphBlock block;
  block.address = reservation.address;
  block.size = bytes;
  block.name = reservation.Name();
  block.slot = CaptureSlot(s);
  GraphCall call;
  call.kind = GraphCall::Kind::kAlloc;
  call.index = static_cast<int>(data.blocks.size());
  data.blocks.push_back(block);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kAlloc;
  desc.dst = reservation.Ref(0);
  desc.bytes = bytes;
  const uintptr_t address = reservation.address;
  blocks_.emplace(address, std::move(reservation));
  CaptureCall(s, std::move(call), desc);
  return MakeBuffer(reinterpret_cast<void*>(address), bytes,
                    MemorySpace::kDevice, &handle);
}

Status SimBackend::ReleaseGraphMemory(Block& block, Stream* stream) {
  const std::string what = "Free of " + block.Name() +
                           ", device memory of graph#" +
                           std::to_string(block.graph) + ": ";
  if (!block.reserved) {
    return FailedPreconditionError(
        what + "a launch allocated it and the launch frees it");
  }
  if (capture_ == nullptr || capture_->id != block.graph) {
    return FailedPreconditionError(
        what + "its capture has ended; only the graph frees it (a free made "
               "during the capture)");
  }
  if (stream == nullptr) {
    return InvalidArgumentError(what + "device memory is freed on a stream");
  }
  const int s = StreamIndex(*stream);
  if (s < 0) {
    return InvalidArgumentError(what + "stream '" +
                                std::string(stream->name()) +
                                "' belongs to another backend");
  }
  if (CaptureSlot(s) < 0) {
    return FailedPreconditionError(
        what + "stream '" + streams_[s].name + "' is not part of the capture; " +
        "graph memory is freed by a stream of its capture");
  }
  if (block.freed) {
    return InvalidArgumentError(what + "already freed in the capture");
  }
  GraphData& data = *capture_->data;
  GraphCall call;
  call.kind = GraphCall::Kind::kFree;
  for (size_t i = 0; i < data.blocks.size(); ++i) {
    if (data.blocks[i].address == block.address) {
      call.index = static_cast<int>(i);
      data.blocks[i].freed = true;
    }
  }
  block.freed = true;
  SimTraceEntry desc;
  desc.kind = SimOpKind::kFree;
  desc.dst = block.Ref(0);
  desc.bytes = block.size;
  CaptureCall(s, std::move(call), desc);
  return OkStatus();
}

// ---------------------------------------------------------------------------
// Begin, end, instantiate.

Status SimBackend::BeginCapture(Stream& stream, CaptureMode mode) {
  const int s = StreamIndex(stream);
  if (s < 0) {
    return InvalidArgumentError("BeginCapture: stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  if (capture_ != nullptr) {
    return FailedPreconditionError(
        "BeginCapture on stream '" + streams_[s].name + "': " +
        (CaptureSlot(s) >= 0 ? std::string("the stream captures already; ")
                             : std::string()) +
        CaptureWhere() + " (the simulator runs one capture at a time)");
  }
  capture_ = std::make_unique<CaptureState>();
  capture_->id = next_capture_id_++;
  capture_->mode = mode;
  capture_->data = std::make_shared<GraphData>();
  capture_->data->id = capture_->id;
  capture_->data->stream_names.push_back(streams_[s].name);
  capture_->streams.push_back(s);
  capture_->known.emplace_back(1, 0);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kBeginCapture;
  desc.label = capture_->data->Name() + " (" +
               std::string(CaptureModeName(mode)) + ")";
  desc.peer_stream = s;
  desc.peer_stream_name = streams_[s].name;
  Trace(SimPhase::kHost, 0, -1, desc);
  return OkStatus();
}

StatusOr<std::unique_ptr<Graph>> SimBackend::EndCapture(Stream& stream) {
  const int s = StreamIndex(stream);
  if (s < 0) {
    return InvalidArgumentError("EndCapture: stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  if (capture_ == nullptr || capture_->streams[0] != s) {
    return FailedPreconditionError(
        "EndCapture on stream '" + streams_[s].name +
        "': the stream is not the origin of a capture" +
        (capture_ != nullptr ? " (" + CaptureWhere() + ")" : std::string()));
  }
  // The capture ends here, whatever follows.
  std::unique_ptr<CaptureState> capture = std::move(capture_);
  const std::shared_ptr<GraphData>& data = capture->data;
  SimTraceEntry desc;
  desc.kind = SimOpKind::kEndCapture;
  desc.peer_stream = s;
  desc.peer_stream_name = streams_[s].name;
  for (size_t j = 1; j < capture->streams.size(); ++j) {
    const int64_t work = KnownOf(capture->known[j], j);
    const int64_t joined = KnownOf(capture->known[0], j);
    if (work > joined) {
      const std::string& name = streams_[capture->streams[j]].name;
      desc.label = data->Name() + " failed: '" + name + "' unjoined";
      Trace(SimPhase::kHost, 0, -1, desc);
      return FailedPreconditionError(
          "EndCapture on stream '" + streams_[s].name + "' (" + data->Name() +
          "): stream '" + name + "' has " + std::to_string(work - joined) +
          " captured operation(s) the origin does not wait for (unjoined: "
          "record an event on it after its last work and Wait for it on '" +
          streams_[s].name + "'); the capture has ended and none of it runs");
    }
  }
  desc.label = data->Name() + ", " + std::to_string(data->calls.size()) +
               " operations";
  Trace(SimPhase::kHost, 0, -1, desc);
  return std::unique_ptr<Graph>(std::make_unique<SimGraph>(this, data));
}

StatusOr<std::unique_ptr<GraphExec>> SimBackend::Instantiate(
    const Graph& graph) {
  const auto* sim_graph = dynamic_cast<const SimGraph*>(&graph);
  if (sim_graph == nullptr || sim_graph->sim_ != this) {
    return InvalidArgumentError(
        "Instantiate: the graph was not captured by this simulated backend");
  }
  const GraphData& data = *sim_graph->data_;
  for (const GraphBlock& block : data.blocks) {
    if (!block.freed) {
      return FailedPreconditionError(
          "Instantiate of " + data.Name() + ": " + block.name + " (" +
          std::to_string(block.size) + " B, allocated on stream '" +
          data.stream_names[block.slot] +
          "') is never freed in the graph; the simulator requires device "
          "memory allocated in a capture to be freed in it");
    }
  }
  auto exec = std::make_unique<SimGraphExec>(this, sim_graph->data_);
  exec->streams_.push_back(-1);
  for (size_t slot = 1; slot < data.stream_names.size(); ++slot) {
    exec->streams_.push_back(AddStream(data.stream_names[slot]));
  }
  for (size_t i = 0; i < data.event_names.size(); ++i) {
    exec->events_.push_back(std::make_unique<SimEvent>(this, next_event_id_++));
  }
  return std::unique_ptr<GraphExec>(std::move(exec));
}

}  // namespace offload
