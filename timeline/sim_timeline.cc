#include "timeline/sim_timeline.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace offload::timeline {
namespace {

struct Op {
  SimTraceEntry what;  // the enqueue entry
  size_t index = 0;    // its position in the trace
  int64_t start = -1;
  int64_t end = -1;
};

// "forward L3" -> "L3"; "L0.qkv_linear" -> "qkv_linear";
// "backward core_attn" -> "core_attn".
std::string ShortLabel(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot != std::string::npos) return name.substr(dot + 1);
  const size_t space = name.rfind(' ');
  return space == std::string::npos ? name : name.substr(space + 1);
}

bool IsForward(const std::string& name) {
  return name.rfind("forward", 0) == 0 ||
         (name.size() > 1 && name[0] == 'L' &&
          std::isdigit(static_cast<unsigned char>(name[1])) &&
          name.find('.') != std::string::npos);
}

// "chunk (stage 0, microbatch 1)" -> 1; -1 when `where` names none.
int Microbatch(const std::string& where) {
  const std::string key = "microbatch ";
  const size_t at = where.find(key);
  if (at == std::string::npos) return -1;
  int microbatch = -1;
  for (size_t i = at + key.size();
       i < where.size() && std::isdigit(static_cast<unsigned char>(where[i]));
       ++i) {
    microbatch = std::max(microbatch, 0) * 10 + (where[i] - '0');
  }
  return microbatch;
}

// "core_attn mb1"; the group alone when no microbatch is known.
std::string GroupLabel(const std::string& group, int microbatch) {
  return microbatch < 0 ? group : group + " mb" + std::to_string(microbatch);
}

// What a kernel named "<name> [<group> of <where>]" belongs to.
struct Attribution {
  std::string name;   // "backward L0.core_attn"
  std::string group;  // "core_attn"
  std::string where;  // "chunk (stage 0, microbatch 1)"
  int microbatch = -1;
};

std::optional<Attribution> KernelAttribution(const std::string& label) {
  if (label.empty() || label.back() != ']') return std::nullopt;
  const size_t open = label.rfind(" [");
  if (open == std::string::npos) return std::nullopt;
  const std::string inside = label.substr(open + 2, label.size() - open - 3);
  const size_t of = inside.find(" of ");
  if (of == std::string::npos) return std::nullopt;
  Attribution out{label.substr(0, open), inside.substr(0, of),
                  inside.substr(of + 4)};
  out.microbatch = Microbatch(out.where);
  return out;
}

std::string Gbps(int64_t bytes, int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f",
                ns > 0 ? static_cast<double>(bytes) / ns : 0.0);
  return text;
}

}  // namespace

Timeline FromSimTrace(const SimBackend& sim,
                      const SimTimelineOptions& options) {
  const std::vector<SimTraceEntry>& trace = sim.trace();
  Timeline out;
  out.title = options.title;
  out.budget_bytes = options.budget_bytes;
  out.budget_label = options.budget_label;
  out.origin_ns =
      options.begin < trace.size() ? trace[options.begin].time_ns : 0;

  // Operations by sequence number (enqueue order), and the counters,
  // applied where the simulator applies them: device allocations and
  // stream-ordered frees when the operation ends, pinned ones at once.
  std::map<uint64_t, Op> ops;
  int64_t live[2] = {0, 0};
  auto space_index = [](MemorySpace s) {
    return s == MemorySpace::kDevice ? 0 : 1;
  };
  const char* names[2] = {kDeviceBytes, kPinnedBytes};
  auto change = [&](MemorySpace space, int64_t delta, int64_t time,
                    size_t index) {
    const int i = space_index(space);
    live[i] += delta;
    if (index >= options.begin) out.counters[names[i]].push_back({time, live[i]});
  };
  for (size_t t = 0; t < trace.size(); ++t) {
    const SimTraceEntry& entry = trace[t];
    if (t == options.begin) {
      for (int i = 0; i < 2; ++i) {
        out.counters[names[i]].push_back({entry.time_ns, live[i]});
      }
    }
    if (entry.phase == SimPhase::kHost) {
      if (entry.kind == SimOpKind::kAlloc) {
        change(entry.dst.space, entry.bytes, entry.time_ns, t);
      } else if (entry.kind == SimOpKind::kFree) {
        change(entry.dst.space, -entry.bytes, entry.time_ns, t);
        if (t >= options.begin) {
          out.instants.push_back(
              Instant{"", "free", entry.time_ns,
                      {{"memory", entry.dst.BlockName()},
                       {"bytes", std::to_string(entry.bytes)}}});
        }
      }
      continue;
    }
    Op& op = ops[entry.seq];
    if (entry.phase == SimPhase::kEnqueue) {
      op.what = entry;
      op.index = t;
    } else if (entry.phase == SimPhase::kStart) {
      op.start = entry.time_ns;
    } else {
      op.end = entry.time_ns;
      if (op.what.kind == SimOpKind::kAlloc) {
        change(op.what.dst.space, op.what.bytes, entry.time_ns, op.index);
      } else if (op.what.kind == SimOpKind::kFree) {
        change(op.what.dst.space, -op.what.bytes, entry.time_ns, op.index);
      }
    }
  }

  // Tracks in order of first use, compute first.
  auto track = [&](const std::string& name) {
    for (const std::string& t : out.tracks) {
      if (t == name) return;
    }
    out.tracks.push_back(name);
  };
  track("compute");

  // Layer attribution (layer mode): allocation windows, then copies.
  std::map<uint64_t, int> device_layer, pinned_layer;
  std::map<uint64_t, const SimTimelineOptions::GroupWindow*> pinned_group;
  const std::vector<size_t>& marks = options.layer_marks;
  for (const auto& [seq, op] : ops) {
    if (op.index < options.begin || marks.empty() ||
        op.what.kind != SimOpKind::kAlloc || op.index < marks[0]) {
      continue;
    }
    int layer = 0;
    while (layer + 1 < static_cast<int>(marks.size()) &&
           op.index >= marks[layer + 1]) {
      ++layer;
    }
    device_layer.emplace(op.what.dst.block, layer);
  }

  // A wait stalls its stream from when the stream could have gone on (the
  // previous operation's end, or the enqueue if later) until it ends.
  std::map<int, int64_t> stream_free;  // stream -> end of its last op
  for (const auto& [seq, op] : ops) {
    if (op.start < 0 || op.end < 0) continue;
    const SimTraceEntry& what = op.what;
    const int64_t ready = std::max(what.time_ns, stream_free[what.stream]);
    stream_free[what.stream] = op.end;
    if (op.index < options.begin) continue;
    Slice slice;
    slice.track = what.stream_name;
    slice.start_ns = op.start;
    slice.end_ns = op.end;
    slice.args["op"] = std::to_string(seq);
    switch (what.kind) {
      case SimOpKind::kKernel: {
        const std::optional<Attribution> group = KernelAttribution(what.label);
        const std::string& name = group ? group->name : what.label;
        slice.name = name;
        slice.kind = name.rfind("backward", 0) == 0 ? SliceKind::kBackward
                     : IsForward(name)              ? SliceKind::kForward
                                                    : SliceKind::kOther;
        if (slice.kind != SliceKind::kOther) slice.label = ShortLabel(name);
        if (group) {
          slice.label = GroupLabel(group->group, group->microbatch);
          if (group->microbatch >= 0) {
            slice.name += " mb" + std::to_string(group->microbatch);
            slice.args["microbatch"] = std::to_string(group->microbatch);
          }
          slice.args["group"] = group->group + " of " + group->where;
        }
        break;
      }
      case SimOpKind::kGather:
      case SimOpKind::kCopy: {
        const bool d2h = what.src.space == MemorySpace::kDevice &&
                         what.dst.space == MemorySpace::kPinnedHost;
        const bool h2d = what.src.space == MemorySpace::kPinnedHost &&
                         what.dst.space == MemorySpace::kDevice;
        if (what.kind == SimOpKind::kGather) {
          slice.kind = SliceKind::kGather;
          slice.name = "gather";
        } else if (what.stream == 0 || (!d2h && !h2d)) {
          slice.kind = SliceKind::kOther;
          slice.name = "copy";
        } else {
          slice.kind = d2h ? SliceKind::kD2H : SliceKind::kH2D;
          slice.name = d2h ? "d2h" : "h2d";
        }
        slice.args["bytes"] = std::to_string(what.bytes);
        slice.args["GB/s"] = Gbps(what.bytes, op.end - op.start);
        slice.args["src"] = what.src.ToString();
        slice.args["dst"] = what.dst.ToString();
        int layer = -1;
        if (slice.kind == SliceKind::kD2H) {
          auto it = device_layer.find(what.src.block);
          if (it != device_layer.end()) {
            layer = it->second;
            pinned_layer[what.dst.block] = layer;
          }
        } else if (slice.kind == SliceKind::kH2D) {
          auto it = pinned_layer.find(what.src.block);
          if (it != pinned_layer.end()) layer = it->second;
        }
        if (layer >= 0) {
          slice.label = "L" + std::to_string(layer);
          slice.name += " L" + std::to_string(layer);
          slice.args["layer"] = std::to_string(layer);
        }
        const SimTimelineOptions::GroupWindow* window = nullptr;
        if (slice.kind == SliceKind::kD2H) {
          for (const auto& w : options.group_windows) {
            if (op.index >= w.begin && op.index < w.end) window = &w;
          }
          if (window != nullptr) pinned_group[what.dst.block] = window;
        } else if (slice.kind == SliceKind::kH2D) {
          auto it = pinned_group.find(what.src.block);
          if (it != pinned_group.end()) window = it->second;
        }
        if (window != nullptr) {
          const int microbatch = Microbatch(window->where);
          slice.label = GroupLabel(window->group, microbatch);
          slice.name += " " + slice.label;
          slice.args["group"] = window->group + " of " + window->where;
          if (microbatch >= 0) {
            slice.args["microbatch"] = std::to_string(microbatch);
          }
        }
        break;
      }
      case SimOpKind::kWait:
        // Copy streams wait for their work all the time; only the compute
        // stream's waits cost step time.
        if (what.stream != 0 || op.end <= ready) continue;
        slice.kind = SliceKind::kStall;
        slice.name = "wait for " + what.peer_stream_name;
        slice.start_ns = ready;
        slice.args["event"] = what.label;
        slice.args["stalled ns"] = std::to_string(op.end - ready);
        out.instants.push_back(Instant{
            what.stream_name, "stall", op.end,
            {{"waited for", what.peer_stream_name},
             {"ns", std::to_string(op.end - ready)}}});
        break;
      case SimOpKind::kFree:
        out.instants.push_back(
            Instant{what.stream_name, "free", op.end,
                    {{"memory", what.dst.BlockName()},
                     {"bytes", std::to_string(what.bytes)}}});
        continue;
      default:
        continue;  // records, allocations: no time on the stream
    }
    track(slice.track);
    out.slices.push_back(std::move(slice));
  }
  const int64_t end = out.EndNs();
  for (const std::string& warning : options.warnings) {
    out.instants.push_back(Instant{"", "warning", end, {{"text", warning}}});
  }
  return out;
}

}  // namespace offload::timeline
