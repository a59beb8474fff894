#include "timeline/timeline.h"

#include <algorithm>

namespace offload::timeline {

const char* SliceKindName(SliceKind kind) {
  switch (kind) {
    case SliceKind::kForward: return "forward";
    case SliceKind::kBackward: return "backward";
    case SliceKind::kD2H: return "d2h";
    case SliceKind::kH2D: return "h2d";
    case SliceKind::kGather: return "gather";
    case SliceKind::kStall: return "stall";
    case SliceKind::kOther: return "other";
  }
  return "other";
}

int64_t Timeline::EndNs() const {
  int64_t end = 0;
  for (const Slice& slice : slices) end = std::max(end, slice.end_ns);
  for (const Instant& instant : instants) end = std::max(end, instant.time_ns);
  for (const auto& [name, points] : counters) {
    for (const CounterPoint& p : points) end = std::max(end, p.time_ns);
  }
  return end;
}

}  // namespace offload::timeline
