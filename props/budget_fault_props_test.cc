// The byte budget (SPEC §4.7) under injected faults: a failed call changes
// nothing beyond what the plan does at that point anyway (offload.h).
//
// Pinned and device allocations, copies, event creations, Records and Waits
// fail at random points. Around every call the property takes a snapshot of
// what the caller can see (each layer's state, the host bytes held, the
// copy counters). When a call fails:
// - with a refusal (not an injected-looking error: a wrong, stale or
//   released handle — here a handle popped a second time): nothing changed;
// - with an injected failure: every layer's state is either what it was
//   before or what the call's successful retry leaves, and no counter went
//   past the retry's: the failed call did only part of what the plan does
//   at that point, never something else.
// Popped bytes are right, and nothing leaks or races.
//
// At 10,000 cases: docs/testing.md, "Properties".

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gtest/gtest.h"
#include "props/retry.h"
#include "rapidcheck/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/fault_backend.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

struct Snapshot {
  std::vector<GroupState> states;
  int64_t host_bytes = 0;
  int64_t bytes_offloaded = 0;
  int64_t bytes_reloaded = 0;
  int64_t tensors_offloaded = 0;

  bool operator==(const Snapshot& o) const {
    return states == o.states && host_bytes == o.host_bytes &&
           bytes_offloaded == o.bytes_offloaded &&
           bytes_reloaded == o.bytes_reloaded &&
           tensors_offloaded == o.tensors_offloaded;
  }
};

Snapshot Take(const Offloader& off, int layers) {
  Snapshot s;
  for (int layer = 0; layer < layers; ++layer) {
    s.states.push_back(off.state(layer));
  }
  s.host_bytes = off.OffloadedBytes();
  s.bytes_offloaded = off.stats().bytes_offloaded;
  s.bytes_reloaded = off.stats().bytes_reloaded;
  s.tensors_offloaded = off.stats().tensors_offloaded;
  return s;
}

std::string Describe(const Snapshot& s) {
  std::string text = "states [";
  for (GroupState state : s.states) {
    text += std::string(" ") + GroupStateName(state);
  }
  return text + " ] host " + std::to_string(s.host_bytes) + " offloaded " +
         std::to_string(s.bytes_offloaded) + " reloaded " +
         std::to_string(s.bytes_reloaded) + " tensors " +
         std::to_string(s.tensors_offloaded);
}

// Whether `failed` lies between `before` and `done` (the successful
// retry's): each state is one of the two, each counter at most done's.
bool Between(const Snapshot& before, const Snapshot& failed,
             const Snapshot& done) {
  for (size_t i = 0; i < failed.states.size(); ++i) {
    if (failed.states[i] != before.states[i] &&
        failed.states[i] != done.states[i]) {
      return false;
    }
  }
  return failed.bytes_offloaded <= done.bytes_offloaded &&
         failed.bytes_reloaded <= done.bytes_reloaded &&
         failed.tensors_offloaded <= done.tensors_offloaded;
}

// Retries `call` through injected failures, as Retry does, checking each
// failure against the snapshot before the call and after its success.
// Adds the name of a call that failed and was retried to `retried` (for
// the tag).
template <typename Call>
auto RetryChecked(const std::string& what, const Offloader& off, int layers,
                  std::set<std::string>& retried, Call call) {
  const Snapshot before = Take(off, layers);
  std::vector<Snapshot> failed;
  auto result = Retry(what, [&] {
    auto r = call();
    if (!StatusOf(r).ok()) failed.push_back(Take(off, layers));
    return r;
  });
  const Snapshot done = Take(off, layers);
  for (const Snapshot& f : failed) {
    if (!Between(before, f, done)) {
      RC_FAIL(what + ": a failed call did what its retry does not: before " +
              Describe(before) + "; after the failure " + Describe(f) +
              "; after the retry " + Describe(done));
    }
  }
  if (!failed.empty()) retried.insert(what);
  return result;
}

std::string Join(const std::set<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += " " + name;
  return text;
}

RC_GTEST_PROP(BudgetFaultProperties, AFailedCallChangesNothingElse, ()) {
  const int layers = *rc::gen::inRange(2, 6);
  const int iterations = *rc::gen::inRange(2, 5);
  SimOptions sim_options;
  sim_options.seed = *rc::gen::arbitrary<uint64_t>();
  FaultInjectingBackend backend(NewSimBackend(sim_options));
  auto& sim = dynamic_cast<SimBackend&>(backend.inner());
  backend.FailPinnedAllocations(*rc::gen::inRange(0, 12),
                                *rc::gen::inRange(0, 3));
  backend.FailDeviceAllocations(*rc::gen::inRange(0, 30),
                                *rc::gen::inRange(0, 3));
  backend.FailCopies(*rc::gen::inRange(0, 40), *rc::gen::inRange(0, 3));
  backend.FailNewEvents(*rc::gen::inRange(0, 20), *rc::gen::inRange(0, 3));
  backend.FailRecords(*rc::gen::inRange(0, 80), *rc::gen::inRange(0, 3));
  backend.FailWaits(*rc::gen::inRange(0, 80), *rc::gen::inRange(0, 3));

  OffloadOptions options;
  options.model_layers = layers;
  options.offloaded_layers = 0;
  options.min_offload_elements = 256;
  // The same tensor count per layer every iteration (so the plan holds);
  // some layers push none. The budget is below the saved total, so the
  // plan must offload (or finds that nothing fits).
  const int64_t tensor_bytes = 32 * 16 * 4;
  std::vector<int> counts;
  int total = 0;
  for (int layer = 0; layer < layers; ++layer) {
    counts.push_back(*rc::gen::inRange(layer == 0 ? 1 : 0, 4));
    total += counts.back();
  }
  options.activation_budget_bytes = *rc::gen::inRange<int64_t>(
      std::max<int64_t>(tensor_bytes, total * tensor_bytes / 3),
      total * tensor_bytes + 1);
  auto offloader = std::move(Offloader::Create(backend, options)).value();

  std::set<std::string> retried;  // calls that failed and were retried
  int refused = 0;  // second pops refused
  for (int iteration = 0; iteration < iterations; ++iteration) {
    std::vector<std::vector<SavedTensor>> saved(layers);
    for (int layer = 0; layer < layers; ++layer) {
      (void)RetryChecked("ForwardStep", *offloader, layers, retried,
                         [&] { return offloader->ForwardStep(); });
      for (int t = 0; t < counts[layer]; ++t) {
        const uint64_t seed = 1000 * iteration + 10 * layer + t;
        Tensor tensor = *Retry("MakeDeviceTensor", [&] {
          return MakeDeviceTensor(backend, DType::kF32, {32, 16}, seed);
        });
        saved[layer].push_back(*RetryChecked(
            "Push", *offloader, layers, retried,
            [&] { return offloader->Push(tensor); }));
      }
    }
    for (int layer = layers - 1; layer >= 0; --layer) {
      (void)RetryChecked("BackwardStep", *offloader, layers, retried,
                         [&] { return offloader->BackwardStep(layer); });
      // In reverse push order, each handle dropped once popped (autograd's
      // order: what the recorded plan frees after).
      for (int t = counts[layer] - 1; t >= 0; --t) {
        const uint64_t seed = 1000 * iteration + 10 * layer + t;
        Tensor popped = *RetryChecked(
            "Pop", *offloader, layers, retried,
            [&] { return offloader->Pop(saved[layer][t]); });
        std::vector<uint8_t> bytes = *Retry(
            "ReadTensorBytes", [&] { return ReadTensorBytes(backend, popped); });
        RC_ASSERT(bytes == PatternBytes(0, tensor_bytes, seed));
        if (*rc::gen::inRange(0, 4) == 0) {
          // A second pop of the same handle (allowed, as in layer mode):
          // it succeeds, or it is refused and changes nothing at all.
          const Snapshot before = Take(*offloader, layers);
          StatusOr<Tensor> again = offloader->Pop(saved[layer][t]);
          if (!again.ok() && !Injected(again.status())) {
            const Snapshot after = Take(*offloader, layers);
            if (!(after == before)) {
              RC_FAIL("a refused Pop changed " + Describe(before) + " to " +
                      Describe(after) + " (" + again.status().ToString() +
                      ")");
            }
            ++refused;
          }
        }
        saved[layer][t] = SavedTensor();
      }
    }
    // FinishBackward ends the iteration whatever fails (an ordering call
    // that failed is reported, its memory kept); the first may find no plan
    // fits (kResourceExhausted: offloading stays off, it records again).
    Status finished = offloader->FinishBackward();
    if (!finished.ok() && finished.code() != StatusCode::kInternal &&
        finished.code() != StatusCode::kResourceExhausted) {
      RC_FAIL("FinishBackward: unexpected error " + finished.ToString());
    }
  }
  const bool offloaded = offloader->stats().bytes_offloaded > 0;
  offloader.reset();
  sim.RunUntilIdle();
  RC_TAG(backend.injected() > 0 ? "faults injected" : "no fault",
         retried.empty() ? std::string("no call failed")
                         : "retried after a failure:" + Join(retried),
         refused > 0 ? "a second pop was refused" : "no refusal",
         offloaded ? "offloaded" : "nothing offloaded");
  if (!sim.hazards().empty()) RC_FAIL(sim.hazards()[0].ToString());
  RC_ASSERT(sim.device_memory().live_bytes == 0);
  RC_ASSERT(sim.pinned_memory().live_bytes == 0);
}

}  // namespace
}  // namespace offload
