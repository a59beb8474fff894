// An SVG figure of one or more timelines in the style of Transformer
// Engine's offloading diagrams: per timeline a panel with one row per
// stream (forward and backward slices labelled by layer or group, offload
// and reload bars, stalls in red), and under the rows the device-memory
// curve with the schedule's budget as a dashed line. Panels are stacked on
// one time axis, so a run without offloading and one with it compare
// directly. Every slice is a <rect class="slice"> with data-track,
// data-kind and data-name attributes and a <title> tooltip.

#ifndef OFFLOAD_TIMELINE_SVG_TIMELINE_H_
#define OFFLOAD_TIMELINE_SVG_TIMELINE_H_

#include <string>
#include <vector>

#include "timeline/timeline.h"

namespace offload::timeline {

struct SvgOptions {
  int width = 1200;       // pixels
  int row_height = 26;
  int memory_height = 90;  // the memory curve under each panel's rows
};

std::string ToSvg(const std::vector<Timeline>& timelines,
                  const SvgOptions& options = {});

}  // namespace offload::timeline

#endif  // OFFLOAD_TIMELINE_SVG_TIMELINE_H_
