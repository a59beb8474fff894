// SPEC §6.7 in the fine-grained mode: pinned and device allocations, copies,
// event creations, Records and Waits fail at random points while random
// chunks of named groups run forward and backward for two iterations (the
// warm-up and one under the frozen plan), with delayed offloads, the pool and
// an in-flight cap on or off, and some tensors never popped. Every call
// succeeds or returns a clear error: retryable ones are retried, a commit or
// a group's backward end that reports an ordering failure has happened and
// is not; popped bytes are always right; no hazard; nothing leaks.

#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "gtest/gtest.h"
#include "props/retry.h"
#include "rapidcheck/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/fault_backend.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

// A call that has happened even when it reports an injected ordering
// failure (its memory is kept, not freed unordered): not retried.
void Accept(const std::string& what, const Status& status) {
  if (!status.ok() && !Injected(status)) {
    RC_FAIL(what + ": unexpected " + status.ToString());
  }
}

struct Saved {
  SavedTensor handle;
  uint64_t seed = 0;
  bool pop = true;
};

RC_GTEST_PROP(PipelineFaultProperties, CorrectDataOrAClearErrorAndNoLeak, ()) {
  const int chunks = *rc::gen::inRange(1, 4);
  // Per chunk, the names of its groups in order (the same every iteration).
  std::vector<std::vector<std::string>> names(chunks);
  for (auto& groups : names) {
    groups = *rc::gen::container<std::vector<std::string>>(
        *rc::gen::inRange(1, 5), rc::gen::element<std::string>("a", "b", "c"));
  }
  SimOptions sim_options;
  sim_options.seed = *rc::gen::arbitrary<uint64_t>();
  sim_options.d2h_gbps = *rc::gen::element(0.05, 55.0);
  FaultInjectingBackend backend(NewSimBackend(sim_options));
  auto& sim = dynamic_cast<SimBackend&>(backend.inner());
  PipelineOffloadOptions options;
  options.offload_modules = {"a", "b"};
  options.min_offload_elements = 256;
  options.activation_offload_fraction = *rc::gen::element(0.5, 1.0);
  options.pinned_pool = *rc::gen::arbitrary<bool>();
  options.delay_offload = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) options.max_inflight["a"] = 0;
  auto offloader = *Retry(
      "Create", [&] { return PipelineOffloader::Create(backend, options); });
  backend.FailPinnedAllocations(*rc::gen::inRange(0, 12),
                                *rc::gen::inRange(0, 4));
  backend.FailDeviceAllocations(*rc::gen::inRange(0, 20),
                                *rc::gen::inRange(0, 4));
  backend.FailCopies(*rc::gen::inRange(0, 30), *rc::gen::inRange(0, 4));
  backend.FailNewEvents(*rc::gen::inRange(0, 20), *rc::gen::inRange(0, 3));
  backend.FailRecords(*rc::gen::inRange(0, 60), *rc::gen::inRange(0, 3));
  backend.FailWaits(*rc::gen::inRange(0, 60), *rc::gen::inRange(0, 3));

  for (int iteration = 0; iteration < 2; ++iteration) {
    // Per chunk, per group (commit order): its saved tensors.
    std::vector<std::vector<std::vector<Saved>>> saved(chunks);
    for (int c = 0; c < chunks; ++c) {
      (void)Retry("StartChunk", [&] { return offloader->StartChunk(0, c); });
      for (const std::string& name : names[c]) {
        (void)Retry("GroupStart", [&] { return offloader->GroupStart(name); });
        std::vector<Saved> group;
        std::vector<Tensor> release;
        const int count = *rc::gen::inRange(0, 3);
        for (int t = 0; t < count; ++t) {
          const uint64_t seed = 1000 * iteration + 100 * c + 10 * group.size() +
                                static_cast<uint64_t>(saved[c].size()) + t;
          Tensor tensor = *Retry("MakeDeviceTensor", [&] {
            return MakeDeviceTensor(backend, DType::kF32, {32, 16}, seed);
          });
          SavedTensor handle =
              *Retry("Push", [&] { return offloader->Push(tensor); });
          group.push_back(Saved{handle, seed, *rc::gen::element(true, true,
                                                                 false)});
          if (*rc::gen::arbitrary<bool>()) {
            // The forward's next op still reads it after the push: frees
            // after the copy must wait for that too.
            SimKernel reader;
            reader.name = "reads " + std::to_string(seed);
            reader.duration_ns = 50'000;
            reader.reads = {{tensor.storage->data(), 32 * 16 * 4}};
            RC_ASSERT(sim.EnqueueKernel(sim.ComputeStream(), reader).ok());
          }
          if (*rc::gen::arbitrary<bool>()) release.push_back(tensor);
        }
        // A retry after "(committed)" would find no open group: accept.
        Status committed = offloader->GroupCommit(name, release);
        while (!committed.ok() &&
               committed.message().find("(committed)") == std::string::npos) {
          if (!Injected(committed)) {
            RC_FAIL("GroupCommit: unexpected " + committed.ToString());
          }
          committed = offloader->GroupCommit(name, release);
        }
        Accept("GroupCommit", committed);
        saved[c].push_back(std::move(group));
      }
    }
    for (int c = 0; c < chunks; ++c) {
      (void)Retry("StartChunkBackward",
            [&] { return offloader->StartChunkBackward(0, c); });
      for (int g = static_cast<int>(names[c].size()) - 1; g >= 0; --g) {
        const std::string& name = names[c][g];
        (void)Retry("GroupBackwardStart",
              [&] { return offloader->GroupBackwardStart(name); });
        for (const Saved& s : saved[c][g]) {
          if (!s.pop) continue;  // autograd may not need it
          Tensor popped = *Retry("Pop", [&] { return offloader->Pop(s.handle); });
          std::vector<uint8_t> bytes = *Retry(
              "ReadTensorBytes", [&] { return ReadTensorBytes(backend, popped); });
          RC_ASSERT(bytes == PatternBytes(0, 32 * 16 * 4, s.seed));
        }
        Accept("GroupBackwardEnd", offloader->GroupBackwardEnd(name));
      }
    }
    Accept("FinishIteration", offloader->FinishIteration());
  }
  const std::vector<std::string> diag_copy = offloader->diagnostics().warnings();
  offloader.reset();
  sim.RunUntilIdle();
  RC_TAG(backend.injected() > 0 ? "faults injected" : "no fault");
  if (!sim.hazards().empty()) {
    for (const auto& w : diag_copy) RC_LOG() << "warning: " << w << "\n";
    RC_LOG() << sim.TraceText();
    RC_FAIL(sim.hazards()[0].ToString());
  }
  RC_ASSERT(sim.device_memory().live_bytes == 0);
  RC_ASSERT(sim.pinned_memory().live_bytes == 0);
}

}  // namespace
}  // namespace offload
