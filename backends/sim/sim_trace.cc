#include "backends/sim/sim_trace.h"

#include <string>
#include <string_view>

namespace offload {

std::string_view SimPhaseName(SimPhase phase) {
  switch (phase) {
    case SimPhase::kEnqueue:
      return "enqueue";
    case SimPhase::kStart:
      return "start";
    case SimPhase::kEnd:
      return "end";
    case SimPhase::kHost:
      return "host";
  }
  return "?";
}

std::string_view SimOpKindName(SimOpKind kind) {
  switch (kind) {
    case SimOpKind::kCopy:
      return "copy";
    case SimOpKind::kGather:
      return "gather";
    case SimOpKind::kKernel:
      return "kernel";
    case SimOpKind::kRecord:
      return "record";
    case SimOpKind::kWait:
      return "wait";
    case SimOpKind::kAlloc:
      return "alloc";
    case SimOpKind::kFree:
      return "free";
    case SimOpKind::kSynchronizeEvent:
    case SimOpKind::kSynchronizeStream:
    case SimOpKind::kSynchronizeDevice:
      return "synchronize";
    case SimOpKind::kBeginCapture:
      return "begin-capture";
    case SimOpKind::kCapture:
      return "capture";
    case SimOpKind::kEndCapture:
      return "end-capture";
    case SimOpKind::kGraphLaunch:
      return "graph-launch";
  }
  return "?";
}

std::string SimBlockRef::BlockName() const {
  return std::string(MemorySpaceName(space)) + "#" + std::to_string(block);
}

std::string SimBlockRef::ToString() const {
  return BlockName() + "+" + std::to_string(offset);
}

// The text is the one the simulator printed before its trace was typed, so
// that traces stay comparable across that change.
std::string SimTraceEntry::Description() const {
  std::string out(SimOpKindName(kind));
  out += ' ';
  switch (kind) {
    case SimOpKind::kCopy:
    case SimOpKind::kGather:
      out += src.ToString() + " -> " + dst.ToString() + " " +
             std::to_string(bytes) + " B";
      break;
    case SimOpKind::kAlloc:
    case SimOpKind::kFree:
      out += dst.BlockName() + " " + std::to_string(bytes) + " B";
      break;
    case SimOpKind::kKernel:
    case SimOpKind::kRecord:
    case SimOpKind::kSynchronizeEvent:
      out += label;
      break;
    case SimOpKind::kWait:
      out += label + " (recorded on '" + peer_stream_name + "')";
      break;
    case SimOpKind::kSynchronizeStream:
      out += "stream '" + peer_stream_name + "'";
      break;
    case SimOpKind::kSynchronizeDevice:
      out += "device";
      break;
    case SimOpKind::kBeginCapture:
    case SimOpKind::kEndCapture:
    case SimOpKind::kGraphLaunch:
      out += label + " on '" + peer_stream_name + "'";
      break;
    case SimOpKind::kCapture:
      out += "on '" + peer_stream_name + "': " + label;
      break;
  }
  return out;
}

std::string SimTraceEntry::ToString() const {
  std::string out =
      "t=" + std::to_string(time_ns) + " " + std::string(SimPhaseName(phase));
  if (seq != 0) out += " op=" + std::to_string(seq);
  out += " [" + stream_name + "] " + Description();
  return out;
}

}  // namespace offload
