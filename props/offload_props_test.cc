// SPEC §6: the engine's guarantees, as properties over random scenarios
// (props/scenario.h) on the simulated GPU. Each draws a whole scenario —
// layers, schedule, saves, speeds, seed — and RapidCheck shrinks a failure
// to a small one.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "props/scenario.h"
#include "rapidcheck/gtest.h"

namespace offload {
namespace {

// Fails the property with the run's status or first mismatch or hazard.
void RequireClean(const ScenarioRun& run) {
  if (!run.status.ok()) RC_FAIL("run failed: " + run.status.ToString());
  if (!run.result.mismatches.empty()) {
    RC_FAIL("mismatch: " + run.result.mismatches[0].ToString());
  }
  if (!run.sim->hazards().empty()) {
    RC_FAIL("hazard: " + run.sim->hazards()[0].ToString());
  }
}

// §6.3 and §6.5: every popped tensor equals what was pushed (dtype, shape,
// strides, name, flags, bytes; tensors never offloaded come back as the very
// same view), over every iteration, for any mix of views, duplicates and
// composites.
RC_GTEST_PROP(OffloadProperties, PoppedTensorsAreBitIdentical, ()) {
  const Scenario scenario = *GenScenario();
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  RC_ASSERT(run.result.iterations == scenario.iterations);
  RC_TAG(scenario.mode == Scenario::Mode::kDefault  ? "default"
         : scenario.mode == Scenario::Mode::kTable ? "table"
                                                    : "manual");
}

// §6.4: no read before the write it depends on, no write or free of memory
// an unordered copy still uses — over every schedule (RequireClean), and no
// device or pinned bytes left after the run beyond retained pinned buffers;
// none at all once the Offloader is gone.
RC_GTEST_PROP(OffloadProperties, NoHazardsAndNothingLeaks, ()) {
  const Scenario scenario = *GenScenario();
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  RC_ASSERT(run.sim->device_memory().live_bytes == 0);
  RC_ASSERT(run.sim->pinned_memory().live_bytes ==
            run.offloader->OffloadedBytes());
  if (!scenario.retain_pinned_buffers) {
    RC_ASSERT(run.offloader->OffloadedBytes() == 0);
  }
  run.offloader.reset();
  run.sim->RunUntilIdle();
  RC_ASSERT(run.sim->pinned_memory().live_bytes == 0);
  RC_ASSERT(run.sim->hazards().empty());
}

// §6.2: device memory never exceeds what the schedule allows: the
// activations of the layers resident at each step (n-k layers with the
// default schedule), plus tensors that are never offloaded.
RC_GTEST_PROP(OffloadProperties, DeviceMemoryStaysWithinTheScheduleBound, ()) {
  const Scenario scenario = *GenScenario();
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  const int64_t peak = run.sim->device_memory().peak_bytes;
  const int64_t bound = DeviceMemoryBound(scenario);
  RC_LOG() << "peak " << peak << " bound " << bound << "\n";
  RC_ASSERT(peak <= bound);
}

// §6.2, sharp: with the default schedule and layers of equal size, the
// peak is at most n-k layers' activations, and exactly that when k > 0
// (during the forward of layer n-k, after layer 0 was released, layers
// 1..n-k are resident).
RC_GTEST_PROP(OffloadProperties, DefaultScheduleHoldsAtMostNMinusKLayers, ()) {
  Scenario scenario = *GenScenario();
  scenario.mode = Scenario::Mode::kDefault;
  scenario.table.clear();
  scenario.offloaded = *rc::gen::inRange(0, scenario.layers);
  // Every layer: the same dense saves (no kept tensors, no sparse views).
  std::vector<SaveRecipe> layer = *rc::gen::container<std::vector<SaveRecipe>>(
      *rc::gen::inRange(1, 5),
      rc::gen::build<SaveRecipe>(
          rc::gen::set(&SaveRecipe::kind,
                       rc::gen::element(SaveRecipe::Kind::kPlain,
                                        SaveRecipe::Kind::kRepeated,
                                        SaveRecipe::Kind::kQkv,
                                        SaveRecipe::Kind::kHalves)),
          rc::gen::set(&SaveRecipe::rows, rc::gen::inRange<int64_t>(32, 65)),
          rc::gen::set(&SaveRecipe::cols, rc::gen::just<int64_t>(32))));
  scenario.saves.assign(scenario.layers, layer);
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  const int64_t per_layer = scenario.Spec().ActivationBytes(0);
  const int64_t peak = run.sim->device_memory().peak_bytes;
  const int resident = scenario.layers - scenario.offloaded;
  RC_LOG() << "peak " << peak << " per layer " << per_layer << "\n";
  RC_ASSERT(peak <= resident * per_layer);
  if (scenario.offloaded > 0) RC_ASSERT(peak == resident * per_layer);
}

// §6.5: each storage is copied at most once per group: the bytes offloaded
// per iteration never exceed the bytes of the offloaded layers' buffers
// (plus contiguous copies of sparse views, which replace their buffer).
RC_GTEST_PROP(OffloadProperties, EachStorageIsCopiedAtMostOncePerGroup, ()) {
  const Scenario scenario = *GenScenario();
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  const ScheduleTable schedule = scenario.EffectiveSchedule();
  const WorkloadSpec spec = scenario.Spec();
  int64_t per_iteration = 0;
  for (const auto& [layer, entry] : schedule) {
    for (const BufferSpec& buffer : spec.layers[layer].buffers) {
      if (buffer.persistent) continue;
      int64_t bytes = DTypeSize(buffer.dtype);
      for (int64_t size : buffer.shape) bytes *= size;
      per_iteration += bytes;
    }
  }
  const OffloaderStats& stats = run.offloader->stats();
  RC_LOG() << "offloaded " << stats.bytes_offloaded << " bound "
           << per_iteration * scenario.iterations << "\n";
  RC_ASSERT(stats.bytes_offloaded <= per_iteration * scenario.iterations);
  RC_ASSERT(stats.bytes_reloaded <= stats.bytes_offloaded);
}

// §6.1: in virtual time, each layer's D2H copies start after its forward
// kernel ended (its tensors' ready points), and its H2D copies end before
// its backward kernel starts (the popped tensors are read after reload).
RC_GTEST_PROP(OffloadProperties, CopiesRunBetweenForwardAndBackward, ()) {
  const Scenario scenario = *GenScenario();
  ScenarioRun run = RunScenario(scenario);
  RequireClean(run);
  const auto& trace = run.sim->trace();
  const int last = scenario.iterations - 1;
  // Start and end of every stream operation.
  std::map<uint64_t, std::pair<int64_t, int64_t>> times;
  for (const SimTraceEntry& e : trace) {
    if (e.phase == SimPhase::kStart) times[e.seq].first = e.time_ns;
    if (e.phase == SimPhase::kEnd) times[e.seq].second = e.time_ns;
  }
  // The trace index of each phase of the last iteration, per layer.
  std::map<std::pair<WorkloadPhase, int>, size_t> at;
  size_t iteration_begin = trace.size();
  for (const PhaseMark& mark : run.marks) {
    if (mark.event.iteration != last) continue;
    at[{mark.event.phase, mark.event.layer}] = mark.trace_index;
    iteration_begin = std::min(iteration_begin, mark.trace_index);
  }
  auto kernel = [&](const std::string& name) {
    for (size_t i = iteration_begin; i < trace.size(); ++i) {
      if (trace[i].phase == SimPhase::kEnqueue &&
          trace[i].kind == SimOpKind::kKernel && trace[i].label == name) {
        return times[trace[i].seq];
      }
    }
    return std::pair<int64_t, int64_t>{-1, -1};
  };
  // Copies of `stream` enqueued in trace entries [begin, end).
  auto copies = [&](const std::string& stream, size_t begin, size_t end) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (size_t i = begin; i < end && i < trace.size(); ++i) {
      if (trace[i].phase == SimPhase::kEnqueue &&
          trace[i].stream_name == stream &&
          trace[i].kind == SimOpKind::kCopy) {
        out.push_back(times[trace[i].seq]);
      }
    }
    return out;
  };
  const int n = scenario.layers;
  const ScheduleTable schedule = scenario.EffectiveSchedule();
  // Where (which driver phase range) the D2H copies of `layer` and the H2D
  // copies of the layers reloaded at `step` are enqueued.
  auto step_range = [&](int step) {
    if (step <= n) {
      return std::pair{at[{WorkloadPhase::kForwardBegin, step - 1}],
                       at[{WorkloadPhase::kBuffersMade, step - 1}]};
    }
    int layer = n - (step - n);
    return std::pair{at[{WorkloadPhase::kBackwardBegin, layer}],
                     at[{WorkloadPhase::kPopped, layer}]};
  };
  int checked = 0;
  for (const auto& [layer, entry] : schedule) {
    std::pair<size_t, size_t> offload_range;
    if (scenario.mode == Scenario::Mode::kManual) {
      offload_range = run.manual_offload_calls[layer];
    } else {
      offload_range = step_range(layer + 2 <= n ? layer + 2 : n + 1);
    }
    const auto forward = kernel("forward L" + std::to_string(layer));
    for (const auto& [start, end] :
         copies("offload_d2h", offload_range.first, offload_range.second)) {
      RC_ASSERT(start >= forward.second);
      ++checked;
    }
    const int reload = ScheduleStep(n, entry.reload_fwd, entry.reload_num);
    auto [begin, end] = step_range(reload);
    const auto backward = kernel("backward L" + std::to_string(layer));
    for (const auto& [start, end_time] : copies("offload_h2d", begin, end)) {
      // Several layers may reload at one step: each must end before its
      // own backward; the earliest backward among them bounds them all.
      (void)start;
      int64_t earliest_backward = backward.first;
      for (const auto& [other, e] : schedule) {
        if (ScheduleStep(n, e.reload_fwd, e.reload_num) == reload) {
          earliest_backward = std::max(
              earliest_backward,
              kernel("backward L" + std::to_string(other)).first);
        }
      }
      RC_ASSERT(end_time <= earliest_backward);
      ++checked;
    }
  }
  RC_CLASSIFY(checked > 0, "copies checked");
}

// §6.6: the same scenario (same seed, same inputs) gives a byte-identical
// trace.
RC_GTEST_PROP(OffloadProperties, SameScenarioSameTrace, ()) {
  ScenarioLimits limits;
  limits.max_layers = 6;
  const Scenario scenario = *GenScenario(limits);
  ScenarioRun first = RunScenario(scenario);
  ScenarioRun second = RunScenario(scenario);
  RequireClean(first);
  RC_ASSERT(first.sim->TraceText() == second.sim->TraceText());
}

}  // namespace
}  // namespace offload
