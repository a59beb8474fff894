#include "timeline/trace_json.h"

#include <nlohmann/json.hpp>

namespace offload::timeline {
namespace {

using nlohmann::json;

double Micros(int64_t ns, int64_t origin) {
  return static_cast<double>(ns - origin) / 1000.0;
}

json Args(const std::map<std::string, std::string>& args) {
  json out = json::object();
  for (const auto& [key, value] : args) out[key] = value;
  return out;
}

}  // namespace

std::string ToChromeTraceJson(const std::vector<Timeline>& timelines) {
  json events = json::array();
  for (size_t p = 0; p < timelines.size(); ++p) {
    const Timeline& t = timelines[p];
    const int pid = static_cast<int>(p) + 1;
    events.push_back({{"ph", "M"}, {"pid", pid}, {"name", "process_name"},
                      {"args", {{"name", t.title}}}});
    events.push_back({{"ph", "M"}, {"pid", pid}, {"name", "process_sort_index"},
                      {"args", {{"sort_index", pid}}}});
    auto tid = [&](const std::string& track) {
      for (size_t i = 0; i < t.tracks.size(); ++i) {
        if (t.tracks[i] == track) return static_cast<int>(i) + 1;
      }
      return 0;  // the whole run
    };
    for (size_t i = 0; i < t.tracks.size(); ++i) {
      events.push_back({{"ph", "M"}, {"pid", pid},
                        {"tid", static_cast<int>(i) + 1},
                        {"name", "thread_name"},
                        {"args", {{"name", t.tracks[i]}}}});
      events.push_back({{"ph", "M"}, {"pid", pid},
                        {"tid", static_cast<int>(i) + 1},
                        {"name", "thread_sort_index"},
                        {"args", {{"sort_index", static_cast<int>(i)}}}});
    }
    for (const Slice& s : t.slices) {
      json args = Args(s.args);
      args["kind"] = SliceKindName(s.kind);
      events.push_back({{"ph", "X"}, {"pid", pid}, {"tid", tid(s.track)},
                        {"name", s.name}, {"cat", SliceKindName(s.kind)},
                        {"ts", Micros(s.start_ns, t.origin_ns)},
                        {"dur", (s.end_ns - s.start_ns) / 1000.0},
                        {"args", args}});
    }
    for (const auto& [name, points] : t.counters) {
      for (const CounterPoint& point : points) {
        events.push_back({{"ph", "C"}, {"pid", pid}, {"name", name},
                          {"ts", Micros(point.time_ns, t.origin_ns)},
                          {"args", {{"bytes", point.value}}}});
      }
    }
    for (const Instant& i : t.instants) {
      json event = {{"ph", "i"}, {"pid", pid}, {"name", i.name},
                    {"ts", Micros(i.time_ns, t.origin_ns)},
                    {"args", Args(i.args)}};
      if (i.track.empty()) {
        event["s"] = "p";  // process-wide
      } else {
        event["s"] = "t";
        event["tid"] = tid(i.track);
      }
      events.push_back(event);
    }
    if (t.budget_bytes >= 0) {
      events.push_back({{"ph", "M"}, {"pid", pid}, {"name", "process_labels"},
                        {"args", {{"labels", t.budget_label}}}});
    }
  }
  json out = {{"traceEvents", events}, {"displayTimeUnit", "ns"}};
  return out.dump(1) + "\n";
}

}  // namespace offload::timeline
