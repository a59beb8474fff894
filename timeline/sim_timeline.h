// FromSimTrace: a Timeline from the simulator's typed trace (backends/sim/
// sim_trace.h) — one track per stream, a slice per kernel, copy, gather and
// stalling wait, the device and pinned byte counters exactly as the
// simulator counts them, and instants for frees, stalls and warnings.

#ifndef OFFLOAD_TIMELINE_SIM_TIMELINE_H_
#define OFFLOAD_TIMELINE_SIM_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "timeline/timeline.h"

namespace offload::timeline {

struct SimTimelineOptions {
  std::string title;
  // The first trace entry to draw (e.g. where the last iteration began);
  // operations enqueued before it are left out, counters start from the
  // bytes live then.
  size_t begin = 0;
  // Layer mode: the trace positions where each layer's forward began. A
  // device allocation between marks i and i+1 belongs to layer i, and so do
  // the copies to host that read it and the copies back from their pinned
  // buffers (their slices get label "L<i>" and arg "layer"). Empty: copies
  // are not attributed.
  std::vector<size_t> layer_marks;
  // Fine-grained mode: trace ranges [begin, end) in which a group was
  // committed. Copies to host enqueued there belong to that group, and so do
  // the copies back from their pinned buffers (label "<group> mb<m>" when
  // `where` names a microbatch, else `group`; arg "group": "<group> of
  // <where>", arg "microbatch").
  struct GroupWindow {
    size_t begin = 0, end = 0;
    std::string group;  // "core_attn"
    std::string where;  // "chunk (stage 0, microbatch 1)"
  };
  std::vector<GroupWindow> group_windows;
  int64_t budget_bytes = -1;
  std::string budget_label;
  // Engine warnings, drawn as instants at the end.
  std::vector<std::string> warnings;
};

// Kernels named "forward ..." or "L<n>.<op>" are forward slices,
// "backward ..." backward ones; copies on the compute stream (byte
// captures) and other kernels are kOther; a wait on the compute stream that
// held it up (it ended after the stream's previous operation and after its
// own enqueue) is a stall, from that point to its end.
//
// A kernel named "<name> [<group> of chunk (stage <s>, microbatch <m>)]"
// (the pipeline driver's compute calls) belongs to that group and
// microbatch, as the copies of a GroupWindow do: slice name "<name> mb<m>",
// label "<group> mb<m>", args "group" ("<group> of chunk (...)") and
// "microbatch".
Timeline FromSimTrace(const SimBackend& sim, const SimTimelineOptions& options);

}  // namespace offload::timeline

#endif  // OFFLOAD_TIMELINE_SIM_TIMELINE_H_
