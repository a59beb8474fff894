// The pictures are built from the simulator's real trace: the JSON parses
// with a real JSON parser (nlohmann/json) into Chrome trace events that
// match the trace's operations one for one, the counters reach exactly the
// simulator's peak, and the SVG parses with a real XML parser (TinyXML-2)
// into the expected rows and slices.

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <tinyxml2.h>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/pipeline_offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "timeline/sim_timeline.h"
#include "timeline/svg_timeline.h"
#include "timeline/timeline.h"
#include "timeline/trace_json.h"
#include "workload/pipeline_driver.h"
#include "workload/sim_compute.h"
#include "workload/workload.h"

namespace offload::timeline {
namespace {

using ::testing::Contains;
using ::testing::IsSupersetOf;

constexpr int kLayers = 4;

// 4 layers of 4 MiB, 2 offloaded, copies (1 GB/s: 4 ms a layer) slower
// than compute (1 ms forward): the compute stream stalls on the offloads.
struct SimRun {
  std::unique_ptr<SimBackend> sim;
  std::vector<size_t> marks;
  Timeline timeline;
};

SimRun MakeRun(int offloaded) {
  SimRun run;
  SimOptions sim_options;
  sim_options.d2h_gbps = sim_options.h2d_gbps = 1.0;
  run.sim = NewSimBackend(sim_options);
  OffloadOptions options;
  options.model_layers = kLayers;
  options.offloaded_layers = offloaded;
  auto offloader = Offloader::Create(*run.sim, options);
  EXPECT_TRUE(offloader.ok());
  WorkloadSpec spec = UniformWorkloadSpec(kLayers, 4 << 20, 2, 1'000'000,
                                          2'000'000);
  WorkloadHooks hooks = SimWorkloadHooks(*run.sim);
  run.marks.assign(kLayers, 0);
  SimBackend* sim = run.sim.get();
  hooks.observer = [&run, sim](const WorkloadEvent& event) {
    if (event.phase == WorkloadPhase::kForwardBegin) {
      run.marks[event.layer] = sim->trace().size();
    }
  };
  auto result = RunWorkload(*run.sim, **offloader, spec, hooks,
                            WorkloadOptions{});
  EXPECT_TRUE(result.ok() && result->ok());
  run.sim->RunUntilIdle();
  SimTimelineOptions timeline_options;
  timeline_options.title = "k = " + std::to_string(offloaded);
  timeline_options.layer_marks = run.marks;
  timeline_options.budget_bytes = int64_t{kLayers - offloaded} * (4 << 20);
  timeline_options.budget_label = "n - k layers";
  timeline_options.warnings = (*offloader)->diagnostics().warnings();
  run.timeline = FromSimTrace(*run.sim, timeline_options);
  return run;
}

// The operations of the trace that take time on a stream, as
// (stream, start, end); a wait of the compute stream counts from when the
// stream was free (its previous operation ended, or the wait was enqueued)
// to its end, if that is later.
std::multiset<std::tuple<std::string, int64_t, int64_t>> TimedOps(
    const SimBackend& sim) {
  std::map<uint64_t, SimTraceEntry> enqueued;
  std::map<uint64_t, int64_t> start, end;
  for (const SimTraceEntry& e : sim.trace()) {
    if (e.phase == SimPhase::kEnqueue) enqueued[e.seq] = e;
    if (e.phase == SimPhase::kStart) start[e.seq] = e.time_ns;
    if (e.phase == SimPhase::kEnd) end[e.seq] = e.time_ns;
  }
  std::multiset<std::tuple<std::string, int64_t, int64_t>> out;
  std::map<int, int64_t> last_end;
  for (const auto& [seq, what] : enqueued) {  // enqueue order, FIFO streams
    if (!end.count(seq)) continue;
    const int64_t free = std::max(what.time_ns, last_end[what.stream]);
    last_end[what.stream] = end[seq];
    if (what.kind == SimOpKind::kWait) {
      if (what.stream == 0 && end[seq] > free) {
        out.insert({what.stream_name, free, end[seq]});
      }
    } else if (what.kind == SimOpKind::kKernel ||
               what.kind == SimOpKind::kCopy ||
               what.kind == SimOpKind::kGather) {
      out.insert({what.stream_name, start[seq], end[seq]});
    }
  }
  return out;
}

TEST(TimelineTest, SlicesAndCountersMatchTheSimulatorsTrace) {
  SimRun run = MakeRun(2);
  const Timeline& t = run.timeline;
  std::multiset<std::tuple<std::string, int64_t, int64_t>> slices;
  for (const Slice& s : t.slices) slices.insert({s.track, s.start_ns, s.end_ns});
  EXPECT_EQ(slices, TimedOps(*run.sim));
  // The device counter reaches exactly the simulator's high-water mark.
  int64_t peak = 0;
  for (const CounterPoint& p : t.counters.at(kDeviceBytes)) {
    peak = std::max(peak, p.value);
  }
  EXPECT_EQ(peak, run.sim->device_memory().peak_bytes);
  EXPECT_EQ(t.counters.at(kDeviceBytes).back().value,
            run.sim->device_memory().live_bytes);
  // Offloads and reloads of layers 0 and 1 only, attributed; and stalls.
  std::set<std::string> copied;
  int stalls = 0;
  for (const Slice& s : t.slices) {
    if (s.kind == SliceKind::kD2H || s.kind == SliceKind::kH2D) {
      copied.insert(s.label);
      EXPECT_TRUE(s.args.count("bytes") && s.args.count("GB/s"));
    }
    stalls += s.kind == SliceKind::kStall && s.track == "compute";
  }
  EXPECT_EQ(copied, (std::set<std::string>{"L0", "L1"}));
  EXPECT_GT(stalls, 0);
}

TEST(TimelineTest, ChromeTraceJsonParsesAndHasTheTimelinesEvents) {
  SimRun off = MakeRun(0);
  SimRun on = MakeRun(2);
  const std::string text = ToChromeTraceJson({off.timeline, on.timeline});
  const nlohmann::json json = nlohmann::json::parse(text);  // throws if bad
  ASSERT_TRUE(json.contains("traceEvents"));
  const nlohmann::json& events = json["traceEvents"];
  ASSERT_TRUE(events.is_array());
  std::map<int, std::vector<std::string>> threads;  // pid -> names
  std::map<int, int> slices, counters, stalls;
  std::map<int, std::string> process;
  for (const nlohmann::json& e : events) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid"));
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "M" && e["name"] == "thread_name") {
      threads[pid].push_back(e["args"]["name"]);
    } else if (ph == "M" && e["name"] == "process_name") {
      process[pid] = e["args"]["name"];
    } else if (ph == "X") {
      ++slices[pid];
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number());
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      ASSERT_TRUE(e.contains("tid") && e.contains("args"));
      if (e["cat"] == "d2h") {
        EXPECT_TRUE(e["args"].contains("bytes"));
        EXPECT_TRUE(e["args"].contains("layer"));
      }
      stalls[pid] += e["cat"] == "stall";
    } else if (ph == "C") {
      ++counters[pid];
      EXPECT_TRUE(e["args"]["bytes"].is_number());
    }
  }
  EXPECT_EQ(process[1], "k = 0");
  EXPECT_EQ(process[2], "k = 2");
  EXPECT_THAT(threads[1], Contains("compute"));
  EXPECT_THAT(threads[2], IsSupersetOf({"compute", "offload_d2h",
                                        "offload_h2d"}));
  EXPECT_EQ(slices[1], static_cast<int>(off.timeline.slices.size()));
  EXPECT_EQ(slices[2], static_cast<int>(on.timeline.slices.size()));
  EXPECT_GT(counters[2], 0);
  EXPECT_EQ(stalls[1], 0);  // nothing to wait for without offloading
  EXPECT_GT(stalls[2], 0);
}

TEST(TimelineTest, SvgIsWellFormedWithRowsAndSlices) {
  SimRun off = MakeRun(0);
  SimRun on = MakeRun(2);
  const std::string svg = ToSvg({off.timeline, on.timeline});
  tinyxml2::XMLDocument doc;
  ASSERT_EQ(doc.Parse(svg.c_str()), tinyxml2::XML_SUCCESS)
      << doc.ErrorStr();
  const tinyxml2::XMLElement* root = doc.RootElement();
  ASSERT_NE(root, nullptr);
  EXPECT_STREQ(root->Name(), "svg");
  std::vector<std::string> panels;
  std::map<std::string, std::set<std::string>> rows;  // panel -> tracks
  std::map<std::string, int> rects, stalls, budgets;
  for (const tinyxml2::XMLElement* g = root->FirstChildElement("g"); g;
       g = g->NextSiblingElement("g")) {
    const char* cls = g->Attribute("class");
    if (cls == nullptr || std::string(cls) != "panel") continue;
    const std::string title = g->Attribute("data-title");
    panels.push_back(title);
    for (const tinyxml2::XMLElement* row = g->FirstChildElement("g"); row;
         row = row->NextSiblingElement("g")) {
      if (row->Attribute("class", "row")) {
        rows[title].insert(row->Attribute("data-track"));
        for (const tinyxml2::XMLElement* r = row->FirstChildElement("rect"); r;
             r = r->NextSiblingElement("rect")) {
          ASSERT_TRUE(r->Attribute("class", "slice"));
          ++rects[title];
          stalls[title] += r->Attribute("data-kind", "stall") != nullptr;
          EXPECT_GT(r->DoubleAttribute("width"), 0.0);
          EXPECT_NE(r->FirstChildElement("title"), nullptr);
        }
      }
      if (row->Attribute("class", "memory")) {
        EXPECT_NE(row->FirstChildElement("path"), nullptr);
        for (const tinyxml2::XMLElement* l = row->FirstChildElement("line"); l;
             l = l->NextSiblingElement("line")) {
          budgets[title] += l->Attribute("class", "budget") != nullptr;
        }
      }
    }
  }
  EXPECT_EQ(panels, (std::vector<std::string>{"k = 0", "k = 2"}));
  EXPECT_THAT(rows["k = 2"], IsSupersetOf({"compute", "offload_d2h",
                                           "offload_h2d"}));
  EXPECT_EQ(rects["k = 0"], static_cast<int>(off.timeline.slices.size()));
  EXPECT_EQ(rects["k = 2"], static_cast<int>(on.timeline.slices.size()));
  EXPECT_EQ(stalls["k = 0"], 0);
  EXPECT_GT(stalls["k = 2"], 0);
  EXPECT_EQ(budgets["k = 2"], 1);
}

// One pipeline rank (rank 0 of pp 1: two microbatches, two layers per
// chunk) through a PipelineOffloader that offloads core_attn and moe_act,
// drawn with the commit windows the pipeline driver reports.
Timeline PipelineTimeline() {
  SimOptions sim_options;
  std::unique_ptr<SimBackend> sim = NewSimBackend(sim_options);
  PipelineOffloadOptions options;
  options.offload_modules = {"core_attn", "moe_act"};
  options.min_offload_elements = 1024;
  auto offloader = PipelineOffloader::Create(*sim, options);
  EXPECT_TRUE(offloader.ok());
  PipelineSpec spec;
  spec.tokens = 64;
  spec.hidden = 128;
  spec.ffn = 256;
  spec.microbatches = 2;
  spec.layers = 2;
  SimTimelineOptions picture;
  PipelineRunOptions run;
  run.iterations = 1;
  SimBackend* s = sim.get();
  run.around_commit = [&](int, const ChunkId& chunk, const std::string& group,
                          bool done) {
    if (!done) {
      picture.group_windows.push_back(
          {s->trace().size(), 0, group, chunk.ToString()});
    } else {
      picture.group_windows.back().end = s->trace().size();
    }
  };
  auto result = RunPipelineRank(*sim, **offloader, spec, 0,
                                SimWorkloadHooks(*sim), run);
  EXPECT_TRUE(result.ok() && result->ok());
  sim->RunUntilIdle();
  return FromSimTrace(*sim, picture);
}

// Fine-grained mode: the copies of each group, to host and back, carry its
// name (label and "group" arg), from the commit windows the pipeline driver
// reports.
TEST(TimelineTest, PipelineCopiesAreAttributedToTheirGroups) {
  const Timeline t = PipelineTimeline();
  std::map<std::string, int> d2h, h2d;
  for (const Slice& slice : t.slices) {
    if (slice.kind != SliceKind::kD2H && slice.kind != SliceKind::kH2D) continue;
    ASSERT_TRUE(slice.args.count("group")) << slice.name;
    EXPECT_THAT(slice.args.at("group"), ::testing::HasSubstr(" of chunk "));
    const std::string group = slice.label.substr(0, slice.label.find(' '));
    (slice.kind == SliceKind::kD2H ? d2h : h2d)[group]++;
  }
  EXPECT_EQ(d2h, h2d);  // every copy to host comes back, same group
  EXPECT_EQ(d2h.size(), 2u);
  EXPECT_GT(d2h["core_attn"], 0);
  EXPECT_GT(d2h["moe_act"], 0);
}

// Fine-grained mode: every forward and backward compute slice and every copy
// slice names its group and microbatch (label "core_attn mb1", the name
// ends in " mb1", args "group" and "microbatch"), as the layer mode's name
// their layer; a copy back belongs to the same group and microbatch as the
// copy to host.
TEST(TimelineTest, PipelineSlicesNameTheirGroupAndMicrobatch) {
  const Timeline t = PipelineTimeline();
  const std::set<std::string> groups = {"attn_norm", "qkv_linear", "core_attn",
                                        "attn_proj", "mlp_norm",  "expert_fc1",
                                        "moe_act"};
  std::map<std::pair<SliceKind, std::string>, int> count;  // kind, label
  for (const Slice& slice : t.slices) {
    if (slice.kind != SliceKind::kForward &&
        slice.kind != SliceKind::kBackward && slice.kind != SliceKind::kD2H &&
        slice.kind != SliceKind::kH2D) {
      continue;
    }
    SCOPED_TRACE(slice.name);
    ASSERT_TRUE(slice.args.count("group"));
    ASSERT_TRUE(slice.args.count("microbatch"));
    const std::string& microbatch = slice.args.at("microbatch");
    ASSERT_THAT(microbatch, ::testing::AnyOf("0", "1"));
    const std::string& arg = slice.args.at("group");
    const std::string group = arg.substr(0, arg.find(' '));
    EXPECT_THAT(groups, Contains(group));
    EXPECT_EQ(arg, group + " of chunk (stage 0, microbatch " + microbatch +
                       ")");
    EXPECT_EQ(slice.label, group + " mb" + microbatch);
    EXPECT_THAT(slice.name, ::testing::EndsWith(" mb" + microbatch));
    if (slice.kind == SliceKind::kBackward) {
      // One backward kernel per group, named after it.
      EXPECT_THAT(slice.name, ::testing::HasSubstr("." + group + " mb"));
    }
    ++count[{slice.kind, slice.label}];
  }
  for (const std::string microbatch : {"0", "1"}) {
    int forward = 0, backward = 0;
    for (const auto& [key, n] : count) {
      if (key.second.substr(key.second.find(" mb") + 3) != microbatch) continue;
      if (key.first == SliceKind::kForward) forward += n;
      if (key.first == SliceKind::kBackward) backward += n;
    }
    EXPECT_EQ(forward, 2 * 10) << "microbatch " << microbatch;  // ops a layer
    EXPECT_EQ(backward, 2 * 7) << "microbatch " << microbatch;  // groups
    for (const std::string group : {"core_attn", "moe_act"}) {
      const std::string label = group + " mb" + microbatch;
      const int d2h = count[std::make_pair(SliceKind::kD2H, label)];
      EXPECT_GT(d2h, 0) << label;
      EXPECT_EQ(d2h, count[std::make_pair(SliceKind::kH2D, label)]) << label;
    }
  }
  // The forward kernels outside a group of their own belong to the
  // innermost open one.
  int residuals = 0;
  for (const Slice& slice : t.slices) {
    if (slice.name.rfind("L0.attn_residual", 0) == 0) {
      ++residuals;
      EXPECT_EQ(slice.label.substr(0, slice.label.find(' ')), "attn_norm");
    }
    if (slice.name.rfind("L1.expert_fc2", 0) == 0) {
      ++residuals;
      EXPECT_EQ(slice.label.substr(0, slice.label.find(' ')), "moe_act");
    }
  }
  EXPECT_EQ(residuals, 4);  // both microbatches
}

}  // namespace
}  // namespace offload::timeline
