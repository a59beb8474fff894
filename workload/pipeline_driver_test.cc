// The fine-grained front door (SPEC §5) end to end on the simulator: the
// pipeline driver's 1F1B and interleaved schedules, nested groups, warm-up
// and freeze, memory, the summary and the option checks.

#include "engine/pipeline_offload.h"

#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "workload/pipeline_driver.h"
#include "workload/sim_compute.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::vector<std::string> kAllModules = {
    "attn_norm", "qkv_linear", "core_attn", "attn_proj",
    "mlp_norm",  "expert_fc1", "moe_act"};

PipelineSpec SmallSpec() {
  PipelineSpec spec;
  spec.tokens = 64;
  spec.hidden = 128;
  spec.ffn = 256;
  spec.compute_ns_per_mib = 200000;
  return spec;
}

PipelineOffloadOptions Options(std::vector<std::string> modules) {
  PipelineOffloadOptions options;
  options.offload_modules = std::move(modules);
  options.min_offload_elements = 1024;
  return options;
}

struct RankRun {
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<PipelineOffloader> offloader;
  PipelineRankResult result;
  std::vector<int64_t> peak;       // device high-water mark per iteration
  std::vector<int64_t> live_after; // device bytes live after each iteration
};

RankRun RunRank(const PipelineSpec& spec, int rank,
                PipelineOffloadOptions options, int iterations = 3,
                SimOptions sim_options = {}) {
  RankRun run;
  run.sim = std::make_unique<SimBackend>(sim_options);
  options.pipeline_rank = rank;
  options.virtual_stages = spec.vpp;
  auto offloader = PipelineOffloader::Create(*run.sim, options);
  EXPECT_THAT(offloader, IsOk());
  if (!offloader.ok()) return run;
  run.offloader = std::move(offloader).value();
  PipelineRunOptions run_options;
  run_options.iterations = iterations;
  SimBackend* sim = run.sim.get();
  run_options.after_iteration = [&run, sim](int) {
    sim->RunUntilIdle();
    run.peak.push_back(sim->device_memory().peak_bytes);
    run.live_after.push_back(sim->device_memory().live_bytes);
    sim->ResetPeaks();
  };
  auto result = RunPipelineRank(*run.sim, *run.offloader, spec, rank,
                                SimWorkloadHooks(*run.sim), run_options);
  EXPECT_THAT(result, IsOk());
  if (result.ok()) run.result = std::move(result).value();
  return run;
}

TEST(PipelineOffloadTest, OneStageOneF1BIsCorrectAndFreesEverything) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 2;
  spec.microbatches = 4;
  spec.layers = 2;
  RankRun run = RunRank(spec, /*rank=*/0, Options(kAllModules));
  ASSERT_NE(run.offloader, nullptr);
  EXPECT_EQ(run.result.iterations, 3);
  EXPECT_THAT(run.result.mismatches, IsEmpty());
  EXPECT_GT(run.result.tensors_checked, 0);
  EXPECT_THAT(run.sim->hazards(), IsEmpty());
  EXPECT_GT(run.offloader->stats().bytes_offloaded, 0);
  EXPECT_EQ(run.offloader->stats().bytes_offloaded,
            run.offloader->stats().bytes_reloaded);
  // Nothing stays on device after an iteration (the driver dropped all).
  for (int64_t live : run.live_after) EXPECT_EQ(live, 0);
  EXPECT_TRUE(run.offloader->warmed_up());
}

TEST(PipelineOffloadTest, InterleavedScheduleOnEveryRank) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 2;
  spec.vpp = 2;
  spec.microbatches = 4;
  spec.layers = 2;
  for (int rank = 0; rank < spec.pp; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    RankRun run = RunRank(spec, rank, Options(kAllModules));
    ASSERT_NE(run.offloader, nullptr);
    EXPECT_THAT(run.result.mismatches, IsEmpty());
    EXPECT_THAT(run.sim->hazards(), IsEmpty());
    for (int64_t live : run.live_after) EXPECT_EQ(live, 0);
    EXPECT_GT(run.offloader->stats().bytes_offloaded, 0);
  }
}

TEST(PipelineOffloadTest, OffloadingLowersThePeakAfterWarmUp) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 4;
  spec.microbatches = 4;
  spec.layers = 3;
  PipelineOffloadOptions off = Options(kAllModules);
  off.enabled = false;
  RankRun baseline = RunRank(spec, 0, off);
  RankRun offloaded = RunRank(spec, 0, Options(kAllModules));
  ASSERT_EQ(baseline.peak.size(), 3u);
  ASSERT_EQ(offloaded.peak.size(), 3u);
  EXPECT_EQ(baseline.offloader->stats().bytes_offloaded, 0);
  EXPECT_LT(offloaded.peak[2], baseline.peak[2]);
  EXPECT_THAT(offloaded.result.mismatches, IsEmpty());
}

// SPEC §5.3 on the driver's 1F1B (rank 0 of 2, 4 microbatches: F0 F1 B0 F2
// B1 F3 B2 B3): each chunk's first backward group is pre-reloaded at the end
// of the previous chunk's backward, behind the next forward, so at 10 GB/s
// each way the offloaded iteration is as fast as the one that offloads
// nothing. (When a chunk's forward only counted as finished at the next
// StartChunk, each boundary exposed a reload: x1.067 here.)
TEST(PipelineOffloadTest, OneFOneBHidesTheReloadAtEachMicrobatchBoundary) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 2;
  spec.microbatches = 4;
  spec.layers = 1;
  SimOptions sim;
  sim.h2d_gbps = 10.0;
  sim.d2h_gbps = 10.0;
  PipelineOffloadOptions off = Options(kAllModules);
  off.enabled = false;
  RankRun base = RunRank(spec, 0, off, 3, sim);
  RankRun run = RunRank(spec, 0, Options({"core_attn", "moe_act"}), 3, sim);
  ASSERT_EQ(base.result.iteration_ns.size(), 3u);
  ASSERT_EQ(run.result.iteration_ns.size(), 3u);
  EXPECT_GT(run.offloader->stats().bytes_reloaded, 0);
  EXPECT_THAT(run.result.mismatches, IsEmpty());
  EXPECT_THAT(run.sim->hazards(), IsEmpty());
  // After the warm-up: within 0.5% of no offloading.
  EXPECT_LE(run.result.iteration_ns[2],
            base.result.iteration_ns[2] + base.result.iteration_ns[2] / 200);
}

TEST(PipelineOffloadTest, SummaryAndRankDelta) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 2;
  spec.microbatches = 2;
  spec.layers = 3;
  PipelineOffloadOptions options = Options({"core_attn", "expert_fc1"});
  options.delta_offload_bytes = 64 * 128 * 2 * 3;  // one core_attn group
  RankRun rank0 = RunRank(spec, 0, options, 2);
  RankRun rank1 = RunRank(spec, 1, options, 2);
  ASSERT_TRUE(rank0.offloader->summary().has_value());
  ASSERT_TRUE(rank1.offloader->summary().has_value());
  const OffloadSummary& s0 = *rank0.offloader->summary();
  const OffloadSummary& s1 = *rank1.offloader->summary();
  EXPECT_EQ(s0.pipeline_rank, 0);
  EXPECT_EQ(s1.pipeline_rank, 1);
  // Rank 1 keeps one more group's bytes on device than rank 0.
  EXPECT_EQ(s0.offloaded_bytes - s1.offloaded_bytes, 64 * 128 * 2 * 3);
  const std::string table = FormatSummaryTable({s0, s1});
  EXPECT_THAT(table, HasSubstr("core_attn"));
  EXPECT_THAT(table, HasSubstr("expert_fc1"));
  EXPECT_THAT(table, HasSubstr("attn_norm"));  // tracked, 0 MB
}

TEST(PipelineOffloadTest, FractionZeroOffloadsNothingAfterWarmUp) {
  PipelineSpec spec = SmallSpec();
  spec.pp = 2;
  spec.microbatches = 2;
  PipelineOffloadOptions options = Options(kAllModules);
  options.activation_offload_fraction = 0.0;
  RankRun run = RunRank(spec, 0, options, 2);
  ASSERT_TRUE(run.offloader->summary().has_value());
  EXPECT_EQ(run.offloader->summary()->offloaded_bytes, 0);
  EXPECT_THAT(run.result.mismatches, IsEmpty());
}

TEST(PipelineOffloadTest, DisabledIsAPassThrough) {
  PipelineSpec spec = SmallSpec();
  PipelineOffloadOptions options = Options(kAllModules);
  options.enabled = false;
  RankRun run = RunRank(spec, 0, options, 1);
  EXPECT_THAT(run.result.mismatches, IsEmpty());
  EXPECT_EQ(run.offloader->stats().tensors_offloaded, 0);
}

TEST(PipelineOffloadTest, InvalidOptionsAreRejectedAtCreate) {
  SimBackend sim(SimOptions{});
  auto bad = [&](auto mutate, const char* what) {
    PipelineOffloadOptions options = Options(kAllModules);
    mutate(options);
    EXPECT_THAT(PipelineOffloader::Create(sim, options),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(what)));
  };
  bad([](auto& o) { o.activation_offload_fraction = 1.5; },
      "activation_offload_fraction");
  bad([](auto& o) { o.activation_offload_fraction = -0.1; },
      "activation_offload_fraction");
  bad([](auto& o) { o.activation_offload_fraction = 0.0 / 0.0; },
      "activation_offload_fraction");
  bad([](auto& o) { o.min_offload_elements = -1; }, "min_offload_elements");
  bad([](auto& o) { o.delta_offload_bytes = -1; }, "delta_offload_bytes");
  bad([](auto& o) { o.pipeline_rank = -1; }, "pipeline_rank");
  bad([](auto& o) { o.virtual_stages = 0; }, "virtual_stages");
  bad([](auto& o) { o.offload_modules.push_back("core_attn"); }, "twice");
  bad([](auto& o) { o.offload_modules.push_back(""); }, "empty");
  bad([](auto& o) { o.max_inflight["core_attn"] = -1; }, "max_inflight");
  bad([](auto& o) { o.min_span_coverage = 2.0; }, "min_span_coverage");
}

}  // namespace
}  // namespace offload
