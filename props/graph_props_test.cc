// SPEC §5.7 as properties: a layer-mode step captured into a graph and
// launched several times with new inputs does what an eager step does — the
// same operations in the same order on every stream, the same bytes back,
// the same device memory — with no hazard, under the default k-of-n schedule
// and manual calls, random stacks, copy speeds and duration jitter.

#include <algorithm>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/graph_step.h"

namespace offload {
namespace {

struct GraphScenario {
  GraphStepSpec spec;
  int offloaded = 0;  // default k-of-n, or manual_offloaded
  SimOptions sim;
  int launches = 2;
};

std::ostream& operator<<(std::ostream& os, const GraphScenario& s) {
  os << (s.spec.manual ? "manual" : "default") << " k=" << s.offloaded
     << " layers=[";
  for (const auto& layer : s.spec.saves) {
    os << " (";
    for (int64_t bytes : layer) os << " " << bytes;
    os << " )";
  }
  os << " ] repeat_first=" << s.spec.repeat_first
     << " fwd_ns=" << s.spec.forward_ns << " d2h=" << s.sim.d2h_gbps
     << " h2d=" << s.sim.h2d_gbps << " jitter=" << s.sim.duration_jitter
     << " seed=" << s.sim.seed << " launches=" << s.launches;
  return os;
}

rc::Gen<GraphScenario> GenGraphScenario() {
  return rc::gen::exec([] {
    GraphScenario s;
    const int n = *rc::gen::inRange(2, 8);
    s.spec.saves.resize(n);
    for (auto& layer : s.spec.saves) {
      layer = *rc::gen::container<std::vector<int64_t>>(
          *rc::gen::inRange(1, 4), rc::gen::inRange<int64_t>(1024, 256 * 1024));
    }
    s.spec.repeat_first = *rc::gen::arbitrary<bool>();
    s.spec.manual = *rc::gen::arbitrary<bool>();
    s.offloaded = *rc::gen::inRange(0, n);  // 0 .. n - 1
    s.spec.manual_offloaded = s.offloaded;
    s.spec.forward_ns = *rc::gen::inRange<int64_t>(2'000, 200'000);
    s.spec.backward_ns = 2 * s.spec.forward_ns;
    s.sim.d2h_gbps = *rc::gen::inRange(2, 100);
    s.sim.h2d_gbps = *rc::gen::inRange(2, 100);
    s.sim.duration_jitter = *rc::gen::element(0.0, 0.3);
    s.sim.seed = *rc::gen::arbitrary<uint64_t>();
    s.launches = *rc::gen::inRange(1, 4);
    return s;
  });
}

OffloadOptions Options(const GraphScenario& s) {
  OffloadOptions options;
  options.model_layers = s.spec.layers();
  options.min_offload_elements = 256;
  // A capture keeps its pinned buffers pooled (its graph refers to them):
  // the eager step it is compared with does the same.
  options.retain_pinned_buffers = true;
  if (s.spec.manual) {
    options.manual_synchronization = true;
    options.offloaded_layers = 0;
  } else {
    options.offloaded_layers = s.offloaded;
  }
  return options;
}

// What a step did on one stream, in start order: kind, bytes, and the
// kernel's name (events are named per run, so records and waits are not).
using OpKey = std::tuple<SimOpKind, int64_t, std::string>;
using StreamOps = std::map<std::string, std::vector<OpKey>>;

std::string Text(const StreamOps& ops) {
  std::string out;
  for (const auto& [stream, keys] : ops) {
    out += stream + ":";
    for (const auto& [kind, bytes, label] : keys) {
      out += " " + std::string(SimOpKindName(kind)) + "/" +
             std::to_string(bytes) + (label.empty() ? "" : "/" + label);
    }
    out += "\n";
  }
  return out;
}

// Consecutive allocations (or frees) on a stream count as one of their total
// bytes: under a capture a reload takes one block per span where an eager
// reload takes one per group (OffloadGroup::StartReload), by design.
StreamOps OpsSince(const SimBackend& sim, size_t from) {
  StreamOps ops;
  const auto& trace = sim.trace();
  for (size_t i = from; i < trace.size(); ++i) {
    const SimTraceEntry& e = trace[i];
    if (e.phase != SimPhase::kStart) continue;
    std::vector<OpKey>& stream = ops[e.stream_name];
    const bool memory = e.kind == SimOpKind::kAlloc || e.kind == SimOpKind::kFree;
    if (memory && !stream.empty() && std::get<0>(stream.back()) == e.kind) {
      std::get<1>(stream.back()) += e.bytes;
      continue;
    }
    const bool named = e.kind == SimOpKind::kKernel;
    stream.emplace_back(e.kind, e.bytes, named ? e.label : "");
  }
  return ops;
}

struct StepRun {
  StreamOps ops;
  int64_t peak = 0;
};

void Require(const Status& status, const char* what) {
  if (!status.ok()) RC_FAIL(std::string(what) + ": " + status.ToString());
}

// Checks one run of the step (eager or a launch) and what it left.
void RequireStepClean(const SimBackend& sim, const GraphStepInputs& inputs,
                      const GraphStepSpec& spec) {
  if (!inputs.mismatches().empty()) RC_FAIL(inputs.mismatches().front());
  RC_ASSERT(inputs.checked_bytes() == spec.CheckedBytes());
  if (!sim.hazards().empty()) RC_FAIL(sim.hazards().front().ToString());
  RC_ASSERT(sim.device_memory().live_bytes == 0);
}

// One warm-up iteration, then `eager` steps run eagerly; returns the last.
StepRun RunEager(const GraphScenario& s) {
  auto sim = NewSimBackend(s.sim);
  StatusOr<std::unique_ptr<Offloader>> offloader =
      Offloader::Create(*sim, Options(s));
  Require(offloader.status(), "Create");
  GraphStepInputs inputs;
  Require((*offloader)->BeginWarmup(), "BeginWarmup");
  Require(EnqueueGraphStep(*sim, **offloader, s.spec, inputs), "warm-up");
  Require((*offloader)->EndWarmup(), "EndWarmup");
  sim->RunUntilIdle();
  inputs.ResetChecks();
  inputs.set_epoch(1);
  sim->ResetPeaks();
  const size_t from = sim->trace().size();
  Require(EnqueueGraphStep(*sim, **offloader, s.spec, inputs), "eager step");
  sim->RunUntilIdle();
  RequireStepClean(*sim, inputs, s.spec);
  return StepRun{OpsSince(*sim, from), sim->device_memory().peak_bytes};
}

RC_GTEST_PROP(GraphProperties, ReplayedStepMatchesAnEagerStep, ()) {
  const GraphScenario s = *GenGraphScenario();
  RC_TAG(s.spec.manual ? "manual" : "default");
  const StepRun eager = RunEager(s);

  auto sim = NewSimBackend(s.sim);
  StatusOr<std::unique_ptr<Offloader>> created =
      Offloader::Create(*sim, Options(s));
  Require(created.status(), "Create");
  Offloader& offloader = **created;
  GraphStepInputs inputs;
  Require(offloader.BeginWarmup(), "BeginWarmup");
  Require(EnqueueGraphStep(*sim, offloader, s.spec, inputs), "warm-up");
  Require(offloader.EndWarmup(), "EndWarmup");
  sim->RunUntilIdle();
  Require(offloader.BeginCapture(), "BeginCapture");
  Require(EnqueueGraphStep(*sim, offloader, s.spec, inputs), "captured step");
  StatusOr<std::unique_ptr<Graph>> graph = offloader.EndCapture();
  Require(graph.status(), "EndCapture");
  StatusOr<std::unique_ptr<GraphExec>> exec = sim->Instantiate(**graph);
  Require(exec.status(), "Instantiate");

  const int64_t layer_max = [&] {
    int64_t most = 0;
    for (int l = 0; l < s.spec.layers(); ++l) {
      most = std::max(most, s.spec.LayerBytes(l));
    }
    return most;
  }();
  const int resident = s.spec.layers() - s.offloaded;
  for (int launch = 0; launch < s.launches; ++launch) {
    inputs.ResetChecks();
    inputs.set_epoch(100 + launch);  // new inputs every launch
    sim->ResetPeaks();
    const size_t from = sim->trace().size();
    Require(sim->Launch(**exec, sim->ComputeStream()), "Launch");
    sim->RunUntilIdle();
    RequireStepClean(*sim, inputs, s.spec);
    const StepRun replay{OpsSince(*sim, from), sim->device_memory().peak_bytes};
    if (replay.ops != eager.ops) {
      RC_FAIL("replay:\n" + Text(replay.ops) + "eager:\n" + Text(eager.ops));
    }
    if (s.sim.duration_jitter == 0.0) RC_ASSERT(replay.peak == eager.peak);
    // SPEC §6.2: n - k layers resident, plus one reloaded ahead.
    RC_ASSERT(replay.peak <= (resident + 1) * layer_max);
  }
}

}  // namespace
}  // namespace offload
