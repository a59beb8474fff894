// An outside test suite (see BUILD): a tiny offload round trip on the
// simulated GPU through the public surface only — Offloader, SimBackend,
// MakeDeviceTensor, ReadTensorBytes, the workload driver.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backends/sim/sim_backend.h"
#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/offload_options.h"
#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "workload/tensor_util.h"
#include "workload/workload.h"

namespace {

using offload::DType;
using offload::NewSimBackend;
using offload::Offloader;
using offload::OffloadOptions;
using offload::SavedTensor;
using offload::SimBackend;
using offload::SimOptions;
using offload::Tensor;

// Only public headers: no status matchers from //testing.
template <typename T>
T ValueOrDie(offload::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

TEST(OutsideSuite, PushedTensorsComeBackWithTheSameBytes) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options;
  options.model_layers = 2;
  options.offloaded_layers = 1;  // layer 0 goes to host and back
  options.min_offload_elements = 1;
  std::unique_ptr<Offloader> offloader =
      ValueOrDie(Offloader::Create(*sim, options));

  std::vector<SavedTensor> saved;
  std::vector<std::vector<uint8_t>> pushed_bytes;
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_EQ(ValueOrDie(offloader->ForwardStep()), layer);
    // The caller drops its tensor after the push, as autograd does, so the
    // offloaded layer's device memory is really released.
    Tensor t = ValueOrDie(offload::MakeDeviceTensor(
        *sim, DType::kBF16, {64, 32}, /*seed=*/static_cast<uint64_t>(layer)));
    pushed_bytes.push_back(ValueOrDie(offload::ReadTensorBytes(*sim, t)));
    saved.push_back(ValueOrDie(offloader->Push(t)));
  }
  for (int layer = 1; layer >= 0; --layer) {
    offload::Status step = offloader->BackwardStep(layer);
    ASSERT_TRUE(step.ok()) << step.ToString();
    Tensor popped = ValueOrDie(offloader->Pop(saved[layer]));
    EXPECT_EQ(ValueOrDie(offload::ReadTensorBytes(*sim, popped)),
              pushed_bytes[layer])
        << "layer " << layer;
  }
  offload::Status finish = offloader->FinishBackward();
  ASSERT_TRUE(finish.ok()) << finish.ToString();

  EXPECT_GT(offloader->stats().bytes_offloaded, 0);  // it did go to host
  EXPECT_EQ(offloader->stats().bytes_reloaded,
            offloader->stats().bytes_offloaded);
  sim->RunUntilIdle();
  EXPECT_TRUE(sim->hazards().empty());
}

TEST(OutsideSuite, TheWorkloadDriverChecksEveryPoppedByte) {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  OffloadOptions options;
  options.model_layers = 3;
  options.offloaded_layers = 2;
  std::unique_ptr<Offloader> offloader =
      ValueOrDie(Offloader::Create(*sim, options));

  // Compute through the simulator's public kernel API: a kernel of the
  // call's duration that declares what it reads and writes.
  offload::WorkloadHooks hooks;
  SimBackend& backend = *sim;
  hooks.compute = [&backend](offload::Stream& stream,
                             const offload::ComputeCall& call) {
    offload::SimKernel kernel{call.name, call.duration_ns, {}, {}, nullptr};
    for (const Tensor* t : call.reads) {
      kernel.reads.push_back({t->storage->data(), t->storage->size_bytes()});
    }
    for (const Tensor* t : call.writes) {
      kernel.writes.push_back({t->storage->data(), t->storage->size_bytes()});
    }
    return backend.EnqueueKernel(stream, std::move(kernel));
  };
  const offload::WorkloadSpec spec = offload::UniformWorkloadSpec(
      /*layers=*/3, /*bytes_per_layer=*/int64_t{4} << 20,
      /*tensors_per_layer=*/2, /*forward_ns=*/100'000,
      /*backward_ns=*/200'000);
  offload::WorkloadOptions run;
  run.iterations = 2;
  offload::WorkloadResult result =
      ValueOrDie(offload::RunWorkload(*sim, *offloader, spec, hooks, run));

  EXPECT_TRUE(result.ok()) << result.mismatches.front().ToString();
  EXPECT_EQ(result.tensors_checked, 2 * 3 * 2);
  EXPECT_GT(offloader->stats().bytes_offloaded, 0);
  sim->RunUntilIdle();
  EXPECT_TRUE(sim->hazards().empty());
}

}  // namespace
