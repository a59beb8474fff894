// The simulator's trace, as typed records.
//
// SimBackend appends one SimTraceEntry per thing that happens: every stream
// operation gets an enqueue, a start and an end entry (one sequence number
// ties the three together, so an operation's interval on its stream is
// [start.time_ns, end.time_ns]); what the host does at once (pinned
// allocation, immediate free, synchronization) gets one host entry. Tests
// and tools query the fields; ToString() is the same information as one line
// of text for people, and is deterministic (block ids, never addresses).

#ifndef OFFLOAD_BACKENDS_SIM_SIM_TRACE_H_
#define OFFLOAD_BACKENDS_SIM_SIM_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/backend.h"

namespace offload {

enum class SimPhase {
  kEnqueue,  // the host enqueued a stream operation
  kStart,    // the operation began on its stream
  kEnd,      // the operation completed
  kHost,     // the host did something at once (no stream involved)
};

enum class SimOpKind {
  kCopy,    // Stream::Copy; src, dst, bytes
  kGather,  // Stream::Gather; src (start of the view), dst, bytes written
  kKernel,  // SimBackend::EnqueueKernel; label is the kernel's name
  kRecord,  // Stream::Record; label is the event ("event#3")
  kWait,    // Stream::Wait; label is the event, peer_stream recorded it
  kAlloc,   // device (stream op) or pinned (host) allocation; dst, bytes
  kFree,    // stream-ordered or immediate (host) free; dst, bytes
  // Host entries only: the host blocked until ...
  kSynchronizeEvent,   // ... the event (label) completed; peer_stream
                       //     recorded it (-1 if never recorded)
  kSynchronizeStream,  // ... peer_stream drained
  kSynchronizeDevice,  // ... every stream drained (RunUntilIdle)
  // Host entries of graph capture; peer_stream is the stream concerned.
  kBeginCapture,  // origin peer_stream starts a capture; label "capture#1
                  //     (global)"
  kCapture,       // peer_stream recorded an operation into the capture
                  //     instead of running it: label is that operation's
                  //     Description(); src, dst, bytes as it would have
  kEndCapture,    // the capture of origin peer_stream ended; label is
                  //     "graph#1, 7 operations" or why it failed
  kGraphLaunch,   // a graph's calls were re-issued, starting on peer_stream
                  //     (label "graph#1 launch 2"); what they enqueue is
                  //     traced as if called eagerly
};

// "enqueue", "start", "end", "host".
std::string_view SimPhaseName(SimPhase phase);
// "copy", "gather", "kernel", "record", "wait", "alloc", "free",
// "synchronize", "begin-capture", "capture", "end-capture", "graph-launch".
std::string_view SimOpKindName(SimOpKind kind);

// A byte position in a simulated allocation. Block ids count allocations of
// both spaces from 1, in allocation order; 0 means "no block".
struct SimBlockRef {
  uint64_t block = 0;
  MemorySpace space = MemorySpace::kDevice;
  int64_t offset = 0;

  // "device#2" / "pinned#1".
  std::string BlockName() const;
  // "device#2+4096".
  std::string ToString() const;
  bool operator==(const SimBlockRef&) const = default;
};

struct SimTraceEntry {
  int64_t time_ns = 0;  // virtual time of the entry
  SimPhase phase = SimPhase::kHost;
  uint64_t seq = 0;  // operation sequence number; 0 for host entries
  int stream = -1;   // stream index (0 = compute); -1 for host entries
  std::string stream_name = "host";
  SimOpKind kind = SimOpKind::kKernel;
  // Copy and gather: where bytes are read and written. Alloc and free: the
  // block, in dst (offset 0). Otherwise block 0.
  SimBlockRef src, dst;
  // Bytes moved (copy, gather) or allocated/freed (alloc, free); else 0.
  int64_t bytes = 0;
  // Kernel name, or the event of a record, wait or event synchronization;
  // for capture entries, see SimOpKind.
  std::string label;
  // Wait, event synchronization: the stream that recorded the event.
  // Stream synchronization: the stream synchronized. Capture entries: the
  // stream concerned. Otherwise -1.
  int peer_stream = -1;
  std::string peer_stream_name;

  // What happened, without time, phase or stream, e.g.
  // "copy device#2+0 -> pinned#1+0 4096 B" or "kernel forward L0".
  std::string Description() const;
  // One line: "t=3000 start op=7 [d2h] copy device#2+0 -> pinned#1+0 4096 B".
  std::string ToString() const;
  bool operator==(const SimTraceEntry&) const = default;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_SIM_TRACE_H_
