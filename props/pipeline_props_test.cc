// SPEC §6 in the fine-grained mode (§5): properties over random pipeline
// schedules — pp ranks, virtual stages, microbatches, layers per chunk,
// offloaded modules, fraction, rank delta, in-flight caps, pool, delayed
// offloads, copy speeds and jitter — each run on its own simulator through
// the pipeline driver (workload/pipeline_driver.h).

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "workload/pipeline_driver.h"
#include "workload/sim_compute.h"

namespace offload {
namespace {

const std::vector<std::string> kModules = {
    "attn_norm", "qkv_linear", "core_attn", "attn_proj",
    "mlp_norm",  "expert_fc1", "moe_act"};

struct PipelineCase {
  PipelineSpec spec;
  int rank = 0;
  PipelineOffloadOptions options;
  SimOptions sim;
  int iterations = 3;
};

rc::Gen<PipelineCase> GenCase() {
  return rc::gen::exec([] {
    PipelineCase c;
    c.spec.pp = *rc::gen::inRange(1, 5);
    c.spec.vpp = *rc::gen::inRange(1, 4);
    c.spec.microbatches =
        c.spec.vpp > 1 ? c.spec.pp * *rc::gen::inRange(1, 3)
                       : *rc::gen::inRange(1, 2 * c.spec.pp + 1);
    c.spec.layers = *rc::gen::inRange(1, 4);
    c.spec.tokens = *rc::gen::inRange<int64_t>(8, 33);
    c.spec.hidden = 32 * *rc::gen::inRange<int64_t>(1, 5);
    c.spec.ffn = 2 * c.spec.hidden;
    c.spec.compute_ns_per_mib = *rc::gen::inRange<int64_t>(0, 4'000'001);
    c.rank = *rc::gen::inRange(0, c.spec.pp);
    for (const std::string& name : kModules) {
      if (*rc::gen::arbitrary<bool>()) c.options.offload_modules.push_back(name);
    }
    c.options.min_offload_elements = 256;
    c.options.activation_offload_fraction =
        *rc::gen::element(0.0, 0.25, 0.5, 0.8, 1.0, 1.0);
    c.options.delta_offload_bytes =
        *rc::gen::element<int64_t>(0, 0, 4096, 65536);
    c.options.pipeline_rank = c.rank;
    c.options.virtual_stages = c.spec.vpp;
    if (*rc::gen::arbitrary<bool>() && !c.options.offload_modules.empty()) {
      c.options.max_inflight[*rc::gen::elementOf(c.options.offload_modules)] =
          *rc::gen::inRange(0, 3);
    }
    c.options.pinned_pool = *rc::gen::arbitrary<bool>();
    c.options.delay_offload = *rc::gen::element(false, false, true);
    c.sim.seed = *rc::gen::arbitrary<uint64_t>();
    c.sim.d2h_gbps = *rc::gen::element(0.05, 1.0, 55.0);
    c.sim.h2d_gbps = *rc::gen::element(0.05, 1.0, 55.0);
    c.sim.duration_jitter = *rc::gen::element(0.0, 0.3);
    return c;
  });
}

std::string Describe(const PipelineCase& c) {
  std::string modules;
  for (const std::string& m : c.options.offload_modules) modules += m + ",";
  std::string caps;
  for (const auto& [name, cap] : c.options.max_inflight) {
    caps += name + ":" + std::to_string(cap) + ",";
  }
  return "pp " + std::to_string(c.spec.pp) + " vpp " +
         std::to_string(c.spec.vpp) + " microbatches " +
         std::to_string(c.spec.microbatches) + " layers " +
         std::to_string(c.spec.layers) + " tokens " +
         std::to_string(c.spec.tokens) + " hidden " +
         std::to_string(c.spec.hidden) + " ns/MiB " +
         std::to_string(c.spec.compute_ns_per_mib) + " rank " +
         std::to_string(c.rank) + " modules [" + modules + "] fraction " +
         std::to_string(c.options.activation_offload_fraction) + " delta " +
         std::to_string(c.options.delta_offload_bytes) + " caps [" + caps +
         "] pool " + std::to_string(c.options.pinned_pool) + " delay " +
         std::to_string(c.options.delay_offload) + " d2h " +
         std::to_string(c.sim.d2h_gbps) + " h2d " +
         std::to_string(c.sim.h2d_gbps) + " jitter " +
         std::to_string(c.sim.duration_jitter) + "\n";
}

struct CaseRun {
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<PipelineOffloader> offloader;
  Status status;
  PipelineRankResult result;
  std::vector<int64_t> live_after;  // device bytes after each iteration
  std::vector<int64_t> peak;        // device high-water mark per iteration
};

CaseRun RunCase(const PipelineCase& c, bool enabled = true) {
  RC_LOG() << Describe(c);
  CaseRun run;
  run.sim = std::make_unique<SimBackend>(c.sim);
  PipelineOffloadOptions options = c.options;
  options.enabled = enabled;
  StatusOr<std::unique_ptr<PipelineOffloader>> offloader =
      PipelineOffloader::Create(*run.sim, options);
  if (!offloader.ok()) {
    run.status = offloader.status();
    return run;
  }
  run.offloader = std::move(offloader).value();
  PipelineRunOptions run_options;
  run_options.iterations = c.iterations;
  SimBackend* sim = run.sim.get();
  run_options.after_iteration = [&run, sim](int) {
    sim->RunUntilIdle();
    run.live_after.push_back(sim->device_memory().live_bytes);
    run.peak.push_back(sim->device_memory().peak_bytes);
    sim->ResetPeaks();
  };
  StatusOr<PipelineRankResult> result =
      RunPipelineRank(*run.sim, *run.offloader, c.spec, c.rank,
                      SimWorkloadHooks(*run.sim), run_options);
  run.status = result.status();
  if (result.ok()) run.result = std::move(result).value();
  return run;
}

void RequireClean(const CaseRun& run) {
  if (!run.status.ok()) RC_FAIL("run failed: " + run.status.ToString());
  if (!run.result.mismatches.empty()) {
    RC_FAIL("mismatch: " + run.result.mismatches[0].ToString());
  }
  if (!run.sim->hazards().empty()) {
    RC_FAIL("hazard: " + run.sim->hazards()[0].ToString());
  }
}

// §6.3, §6.4: bit-identical pops, no hazards, nothing left on device after
// any iteration, pinned bytes only in the pool, none once it is gone.
RC_GTEST_PROP(PipelineProperties, BitIdenticalNoHazardsNoLeaks, ()) {
  const PipelineCase c = *GenCase();
  CaseRun run = RunCase(c);
  RequireClean(run);
  RC_ASSERT(run.result.iterations == c.iterations);
  RC_ASSERT(run.result.tensors_checked > 0);
  for (int64_t live : run.live_after) RC_ASSERT(live == 0);
  RC_ASSERT(run.sim->pinned_memory().live_bytes ==
            run.offloader->OffloadedBytes());
  if (!c.options.pinned_pool) RC_ASSERT(run.offloader->OffloadedBytes() == 0);
  run.offloader.reset();
  run.sim->RunUntilIdle();
  RC_ASSERT(run.sim->pinned_memory().live_bytes == 0);
  RC_ASSERT(run.sim->hazards().empty());
  RC_TAG(c.spec.vpp > 1 ? "interleaved" : "1F1B");
}

// §6.6: the same case runs the same trace.
RC_GTEST_PROP(PipelineProperties, SameCaseSameTrace, ()) {
  PipelineCase c = *GenCase();
  c.iterations = 2;
  CaseRun a = RunCase(c);
  CaseRun b = RunCase(c);
  RequireClean(a);
  RC_ASSERT(a.sim->TraceText() == b.sim->TraceText());
}

// §6.2: offloading never raises the device high-water mark by more than two
// groups above the same schedule without offloading, in any iteration. A
// group's memory goes back only once its copy to host is done, so a group
// reloaded before that (the running group, inline, and the one reloaded
// ahead — one, not several: §5.8e) briefly exists twice; nothing else may
// cost memory.
RC_GTEST_PROP(PipelineProperties, PeakWithinTwoGroupsOfNoOffload, ()) {
  const PipelineCase c = *GenCase();
  CaseRun on = RunCase(c);
  CaseRun off = RunCase(c, /*enabled=*/false);
  RequireClean(on);
  RequireClean(off);
  const int64_t e = DTypeSize(c.spec.dtype);
  const int64_t largest =  // moe_act: fc1_out and act_out, or core_attn
      std::max(2 * c.spec.tokens * c.spec.ffn, 3 * c.spec.tokens * c.spec.hidden) * e;
  for (size_t i = 0; i < on.peak.size(); ++i) {
    RC_LOG() << "iteration " << i << " peak " << on.peak[i] << " vs "
             << off.peak[i] << " + 2 x " << largest << "\n";
    RC_ASSERT(on.peak[i] <= off.peak[i] + 2 * largest);
  }
}

// The memory oracle of §5.4, written from the spec (not from the engine):
// which groups the frozen plan offloads, from the workload's group sizes and
// the rank's backward order (RankSchedule). Also: the per-name summary adds
// up to the plan's bytes.
struct OracleGroup {
  std::string name;
  int ordinal;
  int64_t bytes;
};

std::vector<OracleGroup> LayerGroups(const PipelineSpec& s, int layer) {
  const int64_t e = DTypeSize(s.dtype);
  const int64_t th = s.tokens * s.hidden * e, tf = s.tokens * s.ffn * e;
  // Commit order of one layer (workload/pipeline_driver.h).
  return {{"qkv_linear", layer, th}, {"core_attn", layer, 3 * th},
          {"attn_proj", layer, th},  {"attn_norm", layer, th},
          {"expert_fc1", layer, th}, {"moe_act", layer, 2 * tf},
          {"mlp_norm", layer, th}};
}

RC_GTEST_PROP(PipelineProperties, FrozenPlanFollowsSpecFiveFour, ()) {
  PipelineCase c = *GenCase();
  c.iterations = 1;
  CaseRun run = RunCase(c);
  RequireClean(run);
  const PipelineSpec& s = c.spec;
  // Chunks in forward order, and the backward order, from the schedule.
  std::vector<ChunkId> forward, backward;
  for (const PipelineStep& step : RankSchedule(s, c.rank)) {
    (step.forward ? forward : backward).push_back(step.chunk);
  }
  auto index_of = [&](const ChunkId& id) {
    return static_cast<int>(std::find(forward.begin(), forward.end(), id) -
                            forward.begin());
  };
  std::vector<std::vector<OracleGroup>> groups(forward.size());
  std::vector<std::vector<std::string>> decision(forward.size());
  for (size_t k = 0; k < forward.size(); ++k) {
    for (int l = 0; l < s.layers; ++l) {
      for (const OracleGroup& g : LayerGroups(s, l)) {
        const bool eligible =
            std::count(c.options.offload_modules.begin(),
                       c.options.offload_modules.end(), g.name) > 0;
        groups[k].push_back(g);
        decision[k].push_back(eligible ? "offload" : "not_eligible");
      }
    }
  }
  // (a) margin: per name, the last one in the first backward chunk.
  std::map<std::string, bool> margin;
  for (const ChunkId& id : backward) {
    const int k = index_of(id);
    for (int g = static_cast<int>(groups[k].size()) - 1; g >= 0; --g) {
      if (decision[k][g] != "offload" || margin[groups[k][g].name]) continue;
      margin[groups[k][g].name] = true;
      decision[k][g] = "margin";
    }
  }
  // (b) rank delta.
  const int64_t amount = c.rank * c.options.delta_offload_bytes;
  int64_t kept = 0;
  for (const ChunkId& id : backward) {
    const int k = index_of(id);
    for (size_t g = 0; g < groups[k].size() && kept < amount; ++g) {
      if (decision[k][g] != "offload") continue;
      decision[k][g] = "rank_delta";
      kept += groups[k][g].bytes;
    }
  }
  // (c) fraction: floor(n (1 - f)) with f a decimal fraction.
  const int64_t f_millionths =
      static_cast<int64_t>(c.options.activation_offload_fraction * 1e6 + 0.5);
  int64_t planned = 0;
  for (size_t k = 0; k < forward.size(); ++k) {
    std::vector<int> eligible;
    for (size_t g = 0; g < groups[k].size(); ++g) {
      if (decision[k][g] == "offload") eligible.push_back(static_cast<int>(g));
    }
    const int64_t keep =
        static_cast<int64_t>(eligible.size()) * (1000000 - f_millionths) /
        1000000;
    for (int64_t i = 0; i < keep; ++i) {
      decision[k][eligible[eligible.size() - 1 - i]] = "fraction";
    }
    for (size_t g = 0; g < groups[k].size(); ++g) {
      if (decision[k][g] == "offload") planned += groups[k][g].bytes;
      RC_ASSERT(std::string(GroupDecisionName(run.offloader->Decision(
                    static_cast<int>(k), static_cast<int>(g)))) ==
                decision[k][g]);
    }
  }
  RC_ASSERT(run.offloader->summary().has_value());
  RC_ASSERT(run.offloader->summary()->offloaded_bytes == planned);
}

}  // namespace
}  // namespace offload
