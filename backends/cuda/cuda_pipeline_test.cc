// The fine-grained front door (PipelineOffloader, SPEC §5) on a real GPU:
// the pipeline driver runs each rank's interleaved 1F1B schedule of nested
// named groups through CudaBackend — real D2H and H2D copies on their own
// streams, stream-ordered frees after the copies, pinned pool, reloads one
// group ahead — and checks every popped byte. Compute is not modelled (the
// hook enqueues nothing), so the copies race only the driver's own tensor
// fills and byte captures on the compute stream.

#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "engine/pipeline_offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "workload/pipeline_driver.h"

namespace offload {
namespace {

using ::testing::IsEmpty;

TEST(CudaPipelineTest, EveryRankPopsTheBytesItPushed) {
  PipelineSpec spec;
  spec.pp = 2;
  spec.vpp = 2;
  spec.microbatches = 4;
  spec.layers = 2;
  spec.tokens = 256;
  spec.hidden = 512;
  spec.ffn = 2048;
  WorkloadHooks hooks;
  hooks.compute = [](Stream&, const ComputeCall&) { return OkStatus(); };
  for (int rank = 0; rank < spec.pp; ++rank) {
    for (bool delay : {false, true}) {
      SCOPED_TRACE("rank " + std::to_string(rank) +
                   (delay ? " delayed offloads" : ""));
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaBackend> backend,
                           NewCudaBackend(CudaOptions{}));
      PipelineOffloadOptions options;
      options.offload_modules = {"attn_norm", "qkv_linear", "core_attn",
                                 "attn_proj", "mlp_norm",   "expert_fc1",
                                 "moe_act"};
      options.min_offload_elements = 64 * 1024;
      options.pipeline_rank = rank;
      options.virtual_stages = spec.vpp;
      options.activation_offload_fraction = 0.8;
      options.delay_offload = delay;
      options.max_inflight["moe_act"] = 1;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<PipelineOffloader> offloader,
                           PipelineOffloader::Create(*backend, options));
      PipelineRunOptions run;
      run.iterations = 3;
      ASSERT_OK_AND_ASSIGN(
          PipelineRankResult result,
          RunPipelineRank(*backend, *offloader, spec, rank, hooks, run));
      EXPECT_EQ(result.iterations, 3);
      EXPECT_GT(result.tensors_checked, 0);
      EXPECT_THAT(result.mismatches, IsEmpty());
      EXPECT_GT(offloader->stats().bytes_offloaded, 0);
      EXPECT_EQ(offloader->stats().bytes_offloaded,
                offloader->stats().bytes_reloaded);
      ASSERT_TRUE(offloader->summary().has_value());
      EXPECT_GT(offloader->summary()->offloaded_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace offload
