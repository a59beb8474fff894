// Chrome trace-event JSON (the format Perfetto UI and chrome://tracing
// open) of one or more timelines: each timeline is a process, each track a
// thread; slices are complete events ("X") with their args, counters "C"
// events, instants "i" events. Times are in microseconds from each
// timeline's origin.

#ifndef OFFLOAD_TIMELINE_TRACE_JSON_H_
#define OFFLOAD_TIMELINE_TRACE_JSON_H_

#include <string>
#include <vector>

#include "timeline/timeline.h"

namespace offload::timeline {

// {"traceEvents": [...], "displayTimeUnit": "ns"}, indented.
std::string ToChromeTraceJson(const std::vector<Timeline>& timelines);

}  // namespace offload::timeline

#endif  // OFFLOAD_TIMELINE_TRACE_JSON_H_
