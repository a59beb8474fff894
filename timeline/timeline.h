// Timeline: what ran where and when, as plain data — the input of the
// pictures (trace_json.h: Chrome trace-event JSON for Perfetto UI and
// chrome://tracing; svg_timeline.h: a TE-style figure). Built from the
// simulator's trace (sim_timeline.h) or from timed GPU events. A tool: the
// engine never depends on it.

#ifndef OFFLOAD_TIMELINE_TIMELINE_H_
#define OFFLOAD_TIMELINE_TIMELINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace offload::timeline {

// What a slice is, for colours and legends.
enum class SliceKind {
  kForward,   // a forward kernel of the model
  kBackward,  // a backward kernel of the model
  kD2H,       // a copy to host (an offload)
  kH2D,       // a copy to device (a reload)
  kGather,    // a gather kernel (a sparse view made contiguous)
  kStall,     // the stream waited for another (an event wait that took time)
  kOther,     // anything else (tensor fills, byte captures, ...)
};

// "forward", "backward", "d2h", "h2d", "gather", "stall", "other".
const char* SliceKindName(SliceKind kind);

struct Slice {
  std::string track;  // the stream: "compute", "offload_d2h", ...
  std::string name;   // "forward L3", "d2h L0", ...
  SliceKind kind = SliceKind::kOther;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  // Short text drawn on the slice ("L3"); empty: none.
  std::string label;
  // Details for the trace viewer: layer, group, span, bytes, GB/s, ...
  std::map<std::string, std::string> args;
};

// A value that changes over time (device bytes, pinned bytes).
struct CounterPoint {
  int64_t time_ns = 0;
  int64_t value = 0;
};

// Something that happened at one moment: a release, a stall's end, a
// warning. An empty track means the whole run.
struct Instant {
  std::string track;
  std::string name;
  int64_t time_ns = 0;
  std::map<std::string, std::string> args;
};

struct Timeline {
  std::string title;                // "k = 2 of 5 layers offloaded"
  std::vector<std::string> tracks;  // rows, in drawing order
  std::vector<Slice> slices;
  std::map<std::string, std::vector<CounterPoint>> counters;  // by name
  std::vector<Instant> instants;
  // The device-memory limit the schedule promises (n - k layers, or a byte
  // budget), drawn as a line under the memory curve; < 0: none.
  int64_t budget_bytes = -1;
  std::string budget_label;
  // Time origin: every time is drawn relative to this.
  int64_t origin_ns = 0;

  // The latest end or instant (0 for an empty timeline).
  int64_t EndNs() const;
};

// The counter every picture draws under the rows.
inline constexpr const char* kDeviceBytes = "device bytes";
inline constexpr const char* kPinnedBytes = "pinned bytes";

}  // namespace offload::timeline

#endif  // OFFLOAD_TIMELINE_TIMELINE_H_
