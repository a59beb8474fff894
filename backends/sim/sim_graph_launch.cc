// SimBackend, part 5 of 5: graph launch (the optional capability of
// engine/backend.h). A launch checks that the graph's memory and events can
// be replayed (CheckLaunch), then re-issues the captured calls in their
// captured order through the eager paths of sim_backend.cc and
// sim_memory.cc (Replay), so that a replay moves bytes, takes time, counts
// memory and is checked for hazards exactly like the same calls made
// eagerly. The capture that records them is part 4, sim_graph.cc.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "backends/sim/sim_handles.h"

namespace offload {

// ---------------------------------------------------------------------------
// Launch.

Status SimBackend::CheckReplayRange(const GraphData& graph, const void* data,
                                    int64_t bytes, const std::string& role) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(data);
  for (const GraphBlock& block : graph.blocks) {
    if (address >= block.address &&
        address - block.address + static_cast<uint64_t>(bytes) <=
            static_cast<uint64_t>(block.size)) {
      return OkStatus();  // the launch allocates it
    }
  }
  auto at = Resolve(data, bytes, role, -1);
  if (!at.ok()) {
    return FailedPreconditionError("Launch of " + graph.Name() + ": " +
                                   at.status().message());
  }
  return OkStatus();
}

Status SimBackend::CheckLaunch(const GraphData& graph,
                               const std::vector<int>& streams) {
  for (size_t i = 0; i < graph.calls.size(); ++i) {
    const GraphCall& call = graph.calls[i];
    const std::string role = "operation " + std::to_string(i) +
                             " on stream '" + graph.stream_names[call.slot] +
                             "'";
    if (call.kind == GraphCall::Kind::kCopy ||
        call.kind == GraphCall::Kind::kGather) {
      OFFLOAD_RETURN_IF_ERROR(
          CheckReplayRange(graph, call.src, call.extent, role + ": source"));
      OFFLOAD_RETURN_IF_ERROR(CheckReplayRange(graph, call.dst, call.bytes,
                                               role + ": destination"));
    } else if (call.kind == GraphCall::Kind::kKernel) {
      for (const SimRange& range : call.kernel.reads) {
        OFFLOAD_RETURN_IF_ERROR(
            CheckReplayRange(graph, range.data, range.bytes, role + ": read"));
      }
      for (const SimRange& range : call.kernel.writes) {
        OFFLOAD_RETURN_IF_ERROR(CheckReplayRange(graph, range.data,
                                                 range.bytes, role + ": written"));
      }
    }
  }
  // The allocations as the eager path will see them: frees do not return
  // memory before they run, except to later allocations on their stream.
  int64_t held = held_bytes_[0];
  std::map<int, int64_t> pending;
  for (const auto& [stream, bytes] : pending_free_[0]) pending[stream] = bytes;
  for (const GraphCall& call : graph.calls) {
    const int s = streams[call.slot];
    if (call.kind == GraphCall::Kind::kFree) {
      pending[s] += graph.blocks[call.index].size;
    } else if (call.kind == GraphCall::Kind::kAlloc) {
      const GraphBlock& block = graph.blocks[call.index];
      const int64_t available =
          options_.device_capacity_bytes - held + pending[s];
      if (block.size > available) {
        return ResourceExhaustedError(
            "Launch of " + graph.Name() + ": its allocation of " + block.name +
            " (" + std::to_string(block.size) + " B) on stream '" +
            streams_[s].name + "' would find " + std::to_string(available) +
            " B of " + std::to_string(options_.device_capacity_bytes) +
            " B device memory available");
      }
      held += block.size;
    }
  }
  return OkStatus();
}

Status SimBackend::Replay(const GraphCall& call, int s, SimGraphExec& exec) {
  const GraphData& graph = *exec.data_;
  switch (call.kind) {
    case GraphCall::Kind::kCopy:
      return EnqueueCopy(s, call.dst, call.src, call.bytes);
    case GraphCall::Kind::kGather:
      return EnqueueGather(s, call.dst, call.src, call.element_size,
                           call.shape, call.strides);
    case GraphCall::Kind::kKernel:
      return EnqueueKernelOn(s, call.kernel);
    case GraphCall::Kind::kRecord:
      return RecordEvent(s, *exec.events_[call.index]);
    case GraphCall::Kind::kWait:
      return WaitEvent(s, *exec.events_[call.index]);
    case GraphCall::Kind::kAlloc: {
      const GraphBlock& block = graph.blocks[call.index];
      EnqueueAllocation(s, block.size, block.address, graph.id);
      return OkStatus();
    }
    case GraphCall::Kind::kFree: {
      const GraphBlock& block = graph.blocks[call.index];
      auto it = blocks_.find(block.address);
      if (it == blocks_.end() || it->second.graph != graph.id ||
          it->second.reserved || it->second.freed) {
        return InternalError("the launch's block at " + block.name +
                             "'s address is gone");
      }
      EnqueueFree(it->second, s);
      return OkStatus();
    }
  }
  return InternalError("unknown recorded call");
}

Status SimBackend::Launch(GraphExec& exec, Stream& stream) {
  auto* sim_exec = dynamic_cast<SimGraphExec*>(&exec);
  if (sim_exec == nullptr || sim_exec->sim_ != this) {
    return InvalidArgumentError(
        "Launch: the exec was not instantiated by this simulated backend");
  }
  const int s = StreamIndex(stream);
  const GraphData& graph = *sim_exec->data_;
  if (s < 0) {
    return InvalidArgumentError("Launch of " + graph.Name() + ": stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  if (CaptureSlot(s) >= 0) {
    return FailedPreconditionError(
        "Launch of " + graph.Name() + " on stream '" + streams_[s].name +
        "': the stream captures (" + CaptureWhere() +
        "); the simulator does not capture launches");
  }
  std::vector<int> streams = sim_exec->streams_;
  streams[0] = s;
  OFFLOAD_RETURN_IF_ERROR(CheckLaunch(graph, streams));
  ++sim_exec->launches_;
  SimTraceEntry desc;
  desc.kind = SimOpKind::kGraphLaunch;
  desc.label = graph.Name() + " launch " + std::to_string(sim_exec->launches_);
  desc.peer_stream = s;
  desc.peer_stream_name = streams_[s].name;
  Trace(SimPhase::kHost, 0, -1, desc);
  for (size_t i = 0; i < graph.calls.size(); ++i) {
    const GraphCall& call = graph.calls[i];
    Status status = Replay(call, streams[call.slot], *sim_exec);
    if (!status.ok()) {
      // CheckLaunch makes this unreachable; a simulator bug otherwise.
      return InternalError("Launch of " + graph.Name() + ": operation " +
                           std::to_string(i) + " failed after the checks: " +
                           status.message());
    }
  }
  return OkStatus();
}

}  // namespace offload
