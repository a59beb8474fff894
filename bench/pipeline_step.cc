#include "bench/pipeline_step.h"

#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/layer_gemms.h"
#include "engine/status.h"
#include "workload/pipeline_driver.h"

namespace offload::bench {
namespace {

// Group g is forward GEMM g (layer_gemms.h).
static_assert(kPipelineGroups == kForwardGemms);

std::string Where(int layer, int g, const char* call) {
  return "layer " + std::to_string(layer) + " group " +
         kPipelineGroupNames[g] + ": " + call;
}

}  // namespace

std::vector<PipelineStep> OneFOneB(int pp, int microbatches) {
  PipelineSpec spec;
  spec.pp = pp;
  spec.microbatches = microbatches;
  return RankSchedule(spec, /*rank=*/0);
}

StepCost RunPipelineSchedule(Exec& ex, PipelineOffloader& off, const Shape& s,
                             const std::vector<PipelineStep>& schedule) {
  Backend& be = ex.backend();
  const int64_t T = s.tokens, H = s.hidden;
  StepCost cost;
  auto timed = [&](auto&& f) {
    Clock::time_point t0 = Clock::now();
    auto r = f();
    cost.engine_host_ns += NsSince(t0);
    return r;
  };
  // The handles of each chunk whose forward ran and backward has not.
  std::map<int, std::vector<std::array<SavedTensor, kPipelineGroups>>> saved;

  auto forward = [&](const ChunkId& chunk) {
    std::vector<std::array<SavedTensor, kPipelineGroups>>& handles =
        saved[chunk.microbatch];
    handles.resize(s.layers);
    Must(timed([&] { return off.StartChunk(chunk.stage, chunk.microbatch); }),
         ("StartChunk " + chunk.ToString()).c_str());
    Tensor x = NewActivation(be, T, H, "x0");
    ex.FillInput(x);
    for (int i = 0; i < s.layers; ++i) {
      for (int g = 0; g < kPipelineGroups; ++g) {
        const char* name = kPipelineGroupNames[g];
        Must(timed([&] { return off.GroupStart(name); }),
             Where(i, g, "GroupStart").c_str());
        handles[i][g] = Must(timed([&] { return off.Push(x); }),
                             Where(i, g, "Push").c_str());
        cost.pushes += 1;
        Tensor y = ForwardGemm(ex, s, g, i, x);
        Must(timed([&] { return off.GroupCommit(name); }),
             Where(i, g, "GroupCommit").c_str());
        x = std::move(y);  // drops the driver's reference to the group's input
      }
    }
    ex.Output(x);
  };

  auto backward = [&](const ChunkId& chunk) {
    std::vector<std::array<SavedTensor, kPipelineGroups>>& handles =
        saved[chunk.microbatch];
    Must(timed([&] {
           return off.StartChunkBackward(chunk.stage, chunk.microbatch);
         }),
         ("StartChunkBackward " + chunk.ToString()).c_str());
    void* dy = ex.work(0);
    for (int i = s.layers - 1; i >= 0; --i) {
      const LayerGradients d = GradientsOf(ex, i, dy);
      for (int g = kPipelineGroups - 1; g >= 0; --g) {
        const char* name = kPipelineGroupNames[g];
        Must(timed([&] { return off.GroupBackwardStart(name); }),
             Where(i, g, "GroupBackwardStart").c_str());
        Tensor in = Must(timed([&] { return off.Pop(handles[i][g]); }),
                         Where(i, g, "Pop").c_str());
        InputGradGemm(ex, s, g, i, d.d_out[g], d.d_in[g]);
        WeightGradGemm(ex, s, g, i, in, d.d_out[g]);  // reads the popped one
        in = Tensor();
        handles[i][g] = SavedTensor();  // as autograd: the handle goes too
        Must(timed([&] { return off.GroupBackwardEnd(name); }),
             Where(i, g, "GroupBackwardEnd").c_str());
      }
      dy = d.d_in[0];
    }
    saved.erase(chunk.microbatch);
  };

  for (const PipelineStep& step : schedule) {
    if (step.forward) {
      forward(step.chunk);
    } else {
      backward(step.chunk);
    }
  }
  Must(timed([&] { return off.FinishIteration(); }), "FinishIteration");
  return cost;
}

}  // namespace offload::bench
