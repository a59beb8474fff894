// Helpers shared by the Offloader's tests (engine/offload_test.cc and
// engine/offload_errors_test.cc), all on the simulated GPU.
//
// Tensors made here are written by a simulated kernel on the compute stream
// (no pinned staging, so they also work with tiny pinned capacities), with
// storage byte i equal to PatternByte(i, seed) as MakeDeviceTensor makes
// them; PatternTensorBytes(view, seed) gives the bytes any view should have.

#ifndef OFFLOAD_TESTING_OFFLOAD_TEST_UTIL_H_
#define OFFLOAD_TESTING_OFFLOAD_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/status_matchers.h"
#include "workload/layer_loop.h"
#include "workload/tensor_util.h"

namespace offload {
namespace offload_test {

inline constexpr int64_t kKiB = 1024;
inline constexpr int64_t kMiB = 1024 * kKiB;

// A device tensor of `shape` whose storage is allocated on the compute stream
// and written by a kernel of `duration_ns` there (the "forward compute" that
// produced it): storage byte i becomes PatternByte(i, seed).
inline StatusOr<Tensor> Produce(SimBackend& sim, DType dtype,
                                std::vector<int64_t> shape, uint64_t seed,
                                int64_t duration_ns = 0) {
  Tensor t;
  t.dtype = dtype;
  t.strides = ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.name = "t" + std::to_string(seed);
  const int64_t bytes = std::max<int64_t>(t.nbytes(), 1);
  OFFLOAD_ASSIGN_OR_RETURN(Buffer buffer,
                           sim.AllocateDevice(bytes, sim.ComputeStream()));
  t.storage = std::make_shared<Storage>(std::move(buffer));
  SimKernel kernel;
  kernel.name = "produce " + t.name;
  kernel.duration_ns = duration_ns;
  void* data = t.storage->data();
  kernel.writes = {{data, bytes}};
  kernel.body = [data, bytes, seed](SimBackend& backend) {
    StatusOr<uint8_t*> out = backend.MutableBytes(data, bytes);
    if (out.ok()) FillPattern(*out, bytes, seed);
  };
  OFFLOAD_RETURN_IF_ERROR(sim.EnqueueKernel(sim.ComputeStream(), kernel));
  return t;
}

// A kernel of `duration_ns` on the compute stream that reads the byte extent
// of each of `inputs` (a backward pass using its saved tensors). The hazard
// detector then checks that each input was ready when it was read.
inline Status Consume(SimBackend& sim, const std::vector<Tensor>& inputs,
                      int64_t duration_ns = 0,
                      std::string name = "backward") {
  SimKernel kernel;
  kernel.name = std::move(name);
  kernel.duration_ns = duration_ns;
  for (const Tensor& t : inputs) {
    auto [begin, end] = t.ByteExtent();
    if (end == begin) continue;
    kernel.reads.push_back(
        {static_cast<const char*>(t.storage->data()) + begin, end - begin});
  }
  return sim.EnqueueKernel(sim.ComputeStream(), std::move(kernel));
}

// The logical bytes of `t` read on the host after the device went idle,
// without any pinned staging (so usable when pinned memory is scarce).
inline StatusOr<std::vector<uint8_t>> HostBytes(SimBackend& sim,
                                                const Tensor& t) {
  sim.RunUntilIdle();
  const int64_t size = t.storage->size_bytes();
  OFFLOAD_ASSIGN_OR_RETURN(uint8_t * bytes,
                           sim.MutableBytes(t.storage->data(), size));
  return GatherViewBytes(
      std::span<const uint8_t>(bytes, static_cast<size_t>(size)), 0, t);
}

// The same view without its storage: what a test keeps of a pushed tensor
// once it dropped its own references (as autograd does).
inline Tensor Geometry(const Tensor& t) {
  Tensor g = t;
  g.storage.reset();
  g.ready.reset();
  return g;
}

// Everything an Offloader call could change, as text for readable diffs.
// `with_device_ops`: include the trace length and the simulator's
// allocation counts (a call that changes nothing enqueues nothing).
inline std::string Snapshot(const Offloader& offloader, const SimBackend& sim,
                            int layers, bool with_device_ops = true) {
  std::string out = "states:";
  for (int layer = 0; layer < layers; ++layer) {
    out += std::string(" ") + GroupStateName(offloader.state(layer));
  }
  const OffloaderStats& s = offloader.stats();
  out += "\nstats: offloaded " + std::to_string(s.tensors_offloaded) +
         " kept " + std::to_string(s.tensors_kept) + " spans " +
         std::to_string(s.spans_offloaded) + " bytes_offloaded " +
         std::to_string(s.bytes_offloaded) + " bytes_reloaded " +
         std::to_string(s.bytes_reloaded) + " contiguous " +
         std::to_string(s.views_made_contiguous) + " retained " +
         std::to_string(s.bytes_retained_by_caller) + " pinned_allocations " +
         std::to_string(s.pinned_allocations);
  out += "\nOffloadedBytes " + std::to_string(offloader.OffloadedBytes());
  out += "\nwarnings " +
         std::to_string(offloader.diagnostics().warnings().size());
  if (with_device_ops) {
    out += "\ntrace entries " + std::to_string(sim.trace().size()) +
           "\ndevice allocations " +
           std::to_string(sim.device_memory().allocations) +
           "\npinned allocations " +
           std::to_string(sim.pinned_memory().allocations);
  }
  return out;
}

// Selects trace entries (TraceTime, loops over SimBackend::trace()).
using TraceMatch = std::function<bool(const SimTraceEntry&)>;

// The kernel called `name`.
inline TraceMatch KernelNamed(std::string name) {
  return [name = std::move(name)](const SimTraceEntry& entry) {
    return entry.kind == SimOpKind::kKernel && entry.label == name;
  };
}

// A copy or gather that writes into `space` (into pinned memory: an
// offload), on any stream but the one named `except_stream`.
inline TraceMatch MovesInto(MemorySpace space,
                            std::string except_stream = "") {
  return [space, except_stream = std::move(except_stream)](
             const SimTraceEntry& entry) {
    return (entry.kind == SimOpKind::kCopy ||
            entry.kind == SimOpKind::kGather) &&
           entry.dst.space == space && entry.stream_name != except_stream;
  };
}

// Time of the first trace entry in `phase` that `match` selects; -1 if none.
inline int64_t TraceTime(const SimBackend& sim, SimPhase phase,
                         const TraceMatch& match) {
  for (const SimTraceEntry& entry : sim.trace()) {
    if (entry.phase == phase && match(entry)) return entry.time_ns;
  }
  return -1;
}

// Fixture: a fresh simulator per test; at the end of every test (after its
// locals, the Offloader included, are gone) no hazard may have been found.
class SimOffloadTest : public ::testing::Test {
 protected:
  void UseSim(const SimOptions& options) { sim_ = NewSimBackend(options); }

  void TearDown() override {
    std::string found;
    for (const Hazard& hazard : sim_->hazards()) {
      found += "\n  " + hazard.ToString();
    }
    EXPECT_TRUE(sim_->hazards().empty()) << "hazards:" << found;
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
};

// A pushed tensor as a test remembers it once it dropped the tensor.
struct Pushed {
  SavedTensor handle;
  Tensor geometry;  // dtype, shape, strides, offset, flags (no storage)
  std::vector<uint8_t> expected;
};

// Fixture of the round-trip tests: pushes tensors whose expected bytes it
// remembers, and pops and checks them in the backward.
class OffloaderTest : public SimOffloadTest {
 protected:
  // Pushes `view` (whose storage was filled with pattern `seed`) and
  // remembers what Pop must give back.
  void PushAndRemember(Offloader& offloader, const Tensor& view, uint64_t seed,
                       std::vector<Pushed>& out) {
    ASSERT_OK_AND_ASSIGN(SavedTensor handle, offloader.Push(view));
    out.push_back(
        Pushed{std::move(handle), Geometry(view), PatternTensorBytes(view, seed)});
  }

  // The backward of one layer: pops its tensors in reverse push order,
  // checks each against what was pushed (reading it on the compute stream),
  // runs a backward kernel reading them, then drops them.
  void PopAndCheck(Offloader& offloader, std::vector<Pushed>& pushed,
                   int64_t backward_ns = 0) {
    ASSERT_OK(PopCheckAndConsume(offloader, pushed, backward_ns));
  }

  // PopAndCheck for a driver hook: the differences are EXPECT failures; a
  // failed Pop, read or kernel is returned (and ends the layer's backward).
  Status PopCheckAndConsume(Offloader& offloader, std::vector<Pushed>& pushed,
                            int64_t backward_ns = 0) {
    std::vector<Tensor> popped;
    for (auto it = pushed.rbegin(); it != pushed.rend(); ++it) {
      OFFLOAD_ASSIGN_OR_RETURN(Tensor t, offloader.Pop(it->handle));
      EXPECT_EQ(t.dtype, it->geometry.dtype) << it->geometry.Describe();
      EXPECT_EQ(t.shape, it->geometry.shape) << it->geometry.Describe();
      EXPECT_EQ(t.strides, it->geometry.strides) << it->geometry.Describe();
      EXPECT_EQ(t.name, it->geometry.name);
      EXPECT_EQ(t.flags.parameter, it->geometry.flags.parameter);
      EXPECT_EQ(t.flags.weight, it->geometry.flags.weight);
      EXPECT_EQ(t.flags.do_not_offload, it->geometry.flags.do_not_offload);
      EXPECT_EQ(t.flags.offload_base, it->geometry.flags.offload_base);
      OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                               ReadTensorBytes(*sim_, t));
      EXPECT_TRUE(BytesEqual(bytes, it->expected)) << it->geometry.Describe();
      popped.push_back(std::move(t));
    }
    OFFLOAD_RETURN_IF_ERROR(Consume(*sim_, popped, backward_ns));
    pushed.clear();
    return OkStatus();
  }

  // One iteration over `saved` (one entry per layer, filled by the forward
  // the caller already ran): backward in reverse layer order, then
  // FinishBackward (RunBackwardPass).
  void BackwardAll(Offloader& offloader,
                   std::vector<std::vector<Pushed>>& saved) {
    LayerLoopHooks hooks;
    hooks.backward = [&](int layer) {
      return PopCheckAndConsume(offloader, saved[layer]);
    };
    ASSERT_OK(
        RunBackwardPass(offloader, static_cast<int>(saved.size()), hooks));
  }

  // A forward of `layers` layers, each saving `per_layer` tensors of f32
  // [256 Ki] (1 MiB, exactly the default min_offload_elements) made after
  // the layer's ForwardStep (RunForwardPass).
  void ForwardUniform(Offloader& offloader, int layers, int per_layer,
                      std::vector<std::vector<Pushed>>& saved,
                      uint64_t seed_base = 1) {
    saved.assign(layers, {});
    LayerLoopHooks hooks;
    hooks.forward = [&](int layer) -> Status {
      for (int i = 0; i < per_layer; ++i) {
        uint64_t seed = seed_base + 100 * layer + i;
        OFFLOAD_ASSIGN_OR_RETURN(
            Tensor t, MakeDeviceTensor(*sim_, DType::kF32, {256 * 1024}, seed));
        OFFLOAD_ASSIGN_OR_RETURN(SavedTensor handle, offloader.Push(t));
        saved[layer].push_back(Pushed{std::move(handle), Geometry(t),
                                      PatternTensorBytes(t, seed)});
      }
      return OkStatus();
    };
    ASSERT_OK(RunForwardPass(offloader, layers, hooks));
  }
};

// Options for the default k-of-n schedule.
inline OffloadOptions DefaultOptions(int layers, int offloaded) {
  OffloadOptions options;
  options.model_layers = layers;
  options.offloaded_layers = offloaded;
  return options;
}

// Options for manual synchronization.
inline OffloadOptions ManualOptions(int layers) {
  OffloadOptions options;
  options.model_layers = layers;
  options.manual_synchronization = true;
  return options;
}

}  // namespace offload_test
}  // namespace offload

#endif  // OFFLOAD_TESTING_OFFLOAD_TEST_UTIL_H_
