#include "workload/workload.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "workload/sim_compute.h"

namespace offload {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::Field;
using ::testing::Gt;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kThreshold = 4096;  // min_offload_elements in these tests

std::string HazardText(const SimBackend& sim) {
  std::string text;
  for (const Hazard& hazard : sim.hazards()) text += hazard.ToString() + "\n";
  return text;
}

std::string MismatchText(const WorkloadResult& result) {
  std::string text;
  for (const Mismatch& m : result.mismatches) text += m.ToString() + "\n";
  return text;
}

// Number of tensors (composite components) one iteration pops.
int64_t TensorsPerIteration(const WorkloadSpec& spec) {
  int64_t count = 0;
  for (const LayerSpec& layer : spec.layers) {
    for (const SaveSpec& save : layer.saves) {
      for (const auto& component : save.components) count += component.has_value();
    }
  }
  return count;
}

class WorkloadTest : public ::testing::Test {
 protected:
  void MakeSim(SimOptions options = {}) { sim_ = NewSimBackend(options); }

  OffloadOptions Options(int layers, int offloaded) {
    OffloadOptions options;
    options.model_layers = layers;
    options.offloaded_layers = offloaded;
    options.min_offload_elements = kThreshold;
    return options;
  }

  WorkloadOptions Run(int iterations) {
    WorkloadOptions options;
    options.iterations = iterations;
    options.min_offload_elements = kThreshold;
    return options;
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
};

TEST_F(WorkloadTest, RandomSpecIsValidDeterministicAndVaried) {
  RandomSpecOptions options;
  options.layers = 5;
  options.sparse_views = true;
  WorkloadSpec a = RandomWorkloadSpec(7, options);
  WorkloadSpec b = RandomWorkloadSpec(7, options);
  WorkloadSpec c = RandomWorkloadSpec(8, options);
  ASSERT_OK(ValidateWorkloadSpec(a));
  ASSERT_THAT(a.layers, SizeIs(5));
  EXPECT_EQ(a.TotalActivationBytes(), b.TotalActivationBytes());
  EXPECT_EQ(TensorsPerIteration(a), TensorsPerIteration(b));
  EXPECT_NE(a.TotalActivationBytes(), c.TotalActivationBytes());
  bool small = false, large = false, composite = false, flagged = false;
  for (const LayerSpec& layer : a.layers) {
    EXPECT_EQ(layer.backward_ns, 2 * layer.forward_ns);
    for (const SaveSpec& save : layer.saves) {
      composite |= save.composite;
      for (const auto& component : save.components) {
        if (!component) continue;
        const TensorFlags& f = component->flags;
        flagged |= f.parameter || f.weight || f.do_not_offload;
      }
    }
    for (const BufferSpec& buffer : layer.buffers) {
      int64_t numel = 1;
      for (int64_t s : buffer.shape) numel *= s;
      small |= numel < kThreshold;
      large |= numel >= 2 * kThreshold;
    }
  }
  EXPECT_TRUE(small && large && composite && flagged);
}

TEST_F(WorkloadTest, UniformSpecSplitsTheLayerBytes) {
  WorkloadSpec spec = UniformWorkloadSpec(3, 1 << 20, 4, 1000, 2000);
  ASSERT_OK(ValidateWorkloadSpec(spec));
  ASSERT_THAT(spec.layers, SizeIs(3));
  EXPECT_EQ(spec.ActivationBytes(1), 1 << 20);
  EXPECT_THAT(spec.layers[0].saves, SizeIs(4));
  EXPECT_EQ(spec.layers[2].backward_ns, 2000);
  EXPECT_THAT(UniformWorkloadSpec(0, 1, 1, 0, 0).layers, IsEmpty());
}

TEST_F(WorkloadTest, BitExactRoundTripWithAllButOneLayerOffloaded) {
  RandomSpecOptions random;
  random.layers = 4;
  random.min_offload_elements = kThreshold;
  const WorkloadSpec spec = RandomWorkloadSpec(11, random);
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(4, 3)));
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader, spec,
                                   SimWorkloadHooks(*sim_), Run(3)));
  EXPECT_TRUE(result.ok()) << MismatchText(result);
  EXPECT_EQ(result.iterations, 3);
  EXPECT_EQ(result.tensors_checked, 3 * TensorsPerIteration(spec));
  EXPECT_GT(result.bytes_checked, 3 * spec.TotalActivationBytes() / 2);
  // Flagged and small tensors, and all of layer 3, came back untouched.
  EXPECT_GT(result.tensors_kept, 3 * int64_t{4 * 3});
  EXPECT_LT(result.tensors_kept, result.tensors_checked);
  EXPECT_GT(offloader->stats().bytes_offloaded, 0);
  EXPECT_EQ(offloader->stats().bytes_reloaded,
            offloader->stats().bytes_offloaded);
  EXPECT_THAT(result.iteration_ns, AllOf(SizeIs(3), Each(Gt(0))));
  // The driver held no copies of pushed tensors: offloading freed memory.
  EXPECT_EQ(offloader->stats().bytes_retained_by_caller, 0);
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  // Nothing leaks once the Offloader goes (the driver's parameters went with
  // RunWorkload).
  offloader.reset();
  sim_->RunUntilIdle();
  EXPECT_EQ(sim_->device_memory().live_bytes, 0);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, 0);
}

TEST_F(WorkloadTest, BitExactRoundTripWithOffloadingDisabled) {
  RandomSpecOptions random;
  random.layers = 3;
  random.min_offload_elements = kThreshold;
  const WorkloadSpec spec = RandomWorkloadSpec(5, random);
  OffloadOptions options = Options(3, 2);
  options.enabled = false;
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, options));
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader, spec,
                                   SimWorkloadHooks(*sim_), Run(2)));
  EXPECT_TRUE(result.ok()) << MismatchText(result);
  // Disabled: every tensor comes back as the very view that was pushed.
  EXPECT_EQ(result.tensors_kept, result.tensors_checked);
  EXPECT_EQ(result.tensors_checked, 2 * TensorsPerIteration(spec));
  EXPECT_EQ(offloader->stats().bytes_offloaded, 0);
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(WorkloadTest, SparseViewsAndManySeeds) {
  for (uint64_t seed = 20; seed < 26; ++seed) {
    SCOPED_TRACE(seed);
    MakeSim();
    RandomSpecOptions random;
    random.layers = 3;
    random.min_offload_elements = kThreshold;
    random.sparse_views = true;
    const WorkloadSpec spec = RandomWorkloadSpec(seed, random);
    ASSERT_OK_AND_ASSIGN(auto offloader,
                         Offloader::Create(*sim_, Options(3, 1 + seed % 2)));
    WorkloadOptions run = Run(2);
    // A sparse view the engine made contiguous comes back with dense
    // strides (SPEC §2.2, Offloader::Pop); its bytes must still match.
    run.allow_made_contiguous = true;
    ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                         RunWorkload(*sim_, *offloader, spec,
                                     SimWorkloadHooks(*sim_), run));
    EXPECT_TRUE(result.ok()) << MismatchText(result);
    EXPECT_EQ(result.tensors_checked, 2 * TensorsPerIteration(spec));
    EXPECT_GT(offloader->stats().views_made_contiguous, 0);
    sim_->RunUntilIdle();
    EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  }
}

TEST_F(WorkloadTest, PortableHooksGiveTheSameVerdict) {
  // MakeDeviceTensor and CaptureByCopy: the backend-independent path.
  RandomSpecOptions random;
  random.layers = 3;
  random.min_offload_elements = kThreshold;
  const WorkloadSpec spec = RandomWorkloadSpec(3, random);
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(3, 1)));
  WorkloadHooks hooks;
  hooks.compute = SimCompute(*sim_);
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader, spec, hooks, Run(2)));
  EXPECT_TRUE(result.ok()) << MismatchText(result);
  EXPECT_EQ(result.tensors_checked, 2 * TensorsPerIteration(spec));
  EXPECT_THAT(result.iteration_ns, IsEmpty());  // no clock given
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
  EXPECT_EQ(sim_->pinned_memory().live_bytes, offloader->OffloadedBytes());
}

TEST_F(WorkloadTest, ResidentActivationsStayWithinNMinusKLayers) {
  // SPEC §6.2 with equal layers: at most n-k layers resident at any time.
  const int n = 6, k = 2;
  const int64_t layer_bytes = 1 << 20;
  const WorkloadSpec spec =
      UniformWorkloadSpec(n, layer_bytes, 2, 200'000, 400'000);
  ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(*sim_, Options(n, k)));
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader, spec,
                                   SimWorkloadHooks(*sim_), Run(2)));
  EXPECT_TRUE(result.ok()) << MismatchText(result);
  EXPECT_LE(sim_->device_memory().peak_bytes, (n - k) * layer_bytes);
  EXPECT_GT(sim_->device_memory().peak_bytes, (n - k - 1) * layer_bytes);
  sim_->RunUntilIdle();
  EXPECT_THAT(sim_->hazards(), IsEmpty()) << HazardText(*sim_);
}

TEST_F(WorkloadTest, SameSeedSameTrace) {
  auto trace = [](uint64_t seed) {
    std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
    RandomSpecOptions random;
    random.layers = 3;
    random.min_offload_elements = kThreshold;
    OffloadOptions options;
    options.model_layers = 3;
    options.offloaded_layers = 1;
    options.min_offload_elements = kThreshold;
    auto offloader = Offloader::Create(*sim, options);
    EXPECT_OK(offloader);
    WorkloadOptions run;
    run.iterations = 2;
    EXPECT_OK(RunWorkload(*sim, **offloader, RandomWorkloadSpec(seed, random),
                          SimWorkloadHooks(*sim), run));
    return sim->TraceText();
  };
  const std::string first = trace(4);
  EXPECT_EQ(first, trace(4));
  EXPECT_NE(first, trace(5));
}

TEST_F(WorkloadTest, TamperedExpectationIsReported) {
  RandomSpecOptions random;
  random.layers = 3;
  random.min_offload_elements = kThreshold;
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(3, 1)));
  WorkloadOptions options = Run(2);
  options.tamper_expected = [](int iteration, int layer,
                               const std::string& tensor,
                               std::vector<uint8_t>& expected) {
    if (iteration == 1 && layer == 0 && tensor == "L0.qkv.k") {
      expected[5] ^= 0x40;
    }
  };
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader,
                                   RandomWorkloadSpec(9, random),
                                   SimWorkloadHooks(*sim_), options));
  ASSERT_THAT(result.mismatches, SizeIs(1));
  const Mismatch& m = result.mismatches[0];
  EXPECT_EQ(m.iteration, 1);
  EXPECT_EQ(m.layer, 0);
  EXPECT_EQ(m.tensor, "L0.qkv.k");
  EXPECT_THAT(m.ToString(),
              HasSubstr("1 of " /* bytes differ */));
  EXPECT_THAT(m.what, HasSubstr("logical byte 5"));
  EXPECT_FALSE(result.ok());
}

TEST_F(WorkloadTest, BytesChangedOnTheDeviceAreReported) {
  // A backward kernel that scribbles on what it reads (as a buggy in-place
  // op would): the capture after it sees the damage.
  RandomSpecOptions random;
  random.layers = 2;
  random.min_offload_elements = kThreshold;
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(2, 1)));
  WorkloadHooks hooks = SimWorkloadHooks(*sim_);
  SimBackend& sim = *sim_;
  hooks.compute = [&sim](Stream& stream, const ComputeCall& call) {
    SimKernel kernel{call.name, call.duration_ns, SimRanges(call.reads),
                     SimRanges(call.writes), nullptr};
    if (call.name == "backward L0") {
      const Tensor& victim = *call.reads[0];
      const void* data = victim.storage->data();
      const int64_t at = victim.offset * victim.element_size();
      kernel.writes.push_back(SimRange{static_cast<const uint8_t*>(data) + at,
                                       1});
      kernel.body = [data, at](SimBackend& s) {
        StatusOr<uint8_t*> bytes = s.MutableBytes(data, at + 1);
        if (bytes.ok()) (*bytes)[at] ^= 0xFF;
      };
    }
    return sim.EnqueueKernel(stream, std::move(kernel));
  };
  ASSERT_OK_AND_ASSIGN(WorkloadResult result,
                       RunWorkload(*sim_, *offloader,
                                   RandomWorkloadSpec(2, random), hooks,
                                   Run(1)));
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.mismatches,
              Each(AllOf(Field(&Mismatch::layer, 0),
                         Field(&Mismatch::tensor, HasSubstr("L0.input")))));
}

TEST_F(WorkloadTest, BadArgumentsAreRejected) {
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(2, 1)));
  WorkloadSpec spec = UniformWorkloadSpec(2, 4096, 1, 10, 20);
  WorkloadHooks none;
  EXPECT_THAT(RunWorkload(*sim_, *offloader, spec, none, Run(1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("compute")));
  WorkloadSpec bad = spec;
  bad.layers[1].saves[0].components[0]->buffer = 3;
  EXPECT_THAT(RunWorkload(*sim_, *offloader, bad, SimWorkloadHooks(*sim_),
                          Run(1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer 1")));
  bad = spec;
  bad.layers[0].saves[0].components.push_back(std::nullopt);
  EXPECT_THAT(ValidateWorkloadSpec(bad),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("plain")));
  EXPECT_THAT(ValidateWorkloadSpec(WorkloadSpec{}),
              StatusIs(StatusCode::kInvalidArgument));
  // A view recipe that does not fit its buffer fails with its context, and
  // leaves nothing running.
  bad = spec;
  bad.layers[0].saves[0].components[0]->ops = {ViewOp::Transpose(0, 5)};
  EXPECT_THAT(RunWorkload(*sim_, *offloader, bad, SimWorkloadHooks(*sim_),
                          Run(1)),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("iteration 0 layer 0"),
                             HasSubstr("L0.act0"))));
}

TEST(CompleteHooksTest, FillsTheDefaultsAndNamesTheCallerWithoutCompute) {
  WorkloadHooks hooks;
  EXPECT_THAT(CompleteHooks(hooks, "RunSomething"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("RunSomething: no compute hook")));
  hooks.compute = [](Stream&, const ComputeCall&) { return OkStatus(); };
  ASSERT_OK_AND_ASSIGN(WorkloadHooks complete,
                       CompleteHooks(hooks, "RunSomething"));
  EXPECT_TRUE(complete.compute);
  EXPECT_TRUE(complete.make_tensor);
  EXPECT_TRUE(complete.capture);
  EXPECT_FALSE(complete.clock);
  EXPECT_FALSE(complete.observer);
}

TEST_F(WorkloadTest, ObserverSeesEveryPhaseInOrder) {
  ASSERT_OK_AND_ASSIGN(auto offloader,
                       Offloader::Create(*sim_, Options(2, 1)));
  WorkloadHooks hooks = SimWorkloadHooks(*sim_);
  std::vector<std::string> seen;
  hooks.observer = [&seen](const WorkloadEvent& event) {
    seen.push_back(std::to_string(static_cast<int>(event.phase)) + "@" +
                   std::to_string(event.layer));
  };
  ASSERT_OK(RunWorkload(*sim_, *offloader,
                        UniformWorkloadSpec(2, 1 << 16, 1, 10, 20), hooks,
                        Run(1)));
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "0@0", "1@0", "2@0", "3@0", "0@1", "1@1", "2@1", "3@1",
                      "4@1", "5@1", "6@1", "4@0", "5@0", "6@0", "7@-1"}));
}

}  // namespace
}  // namespace offload
