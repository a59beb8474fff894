// A workload driver: runs a layer stack's forward and backward through an
// Offloader on any Backend, the way autograd drives TE's saved-tensor hooks,
// and checks every tensor that comes back from Pop.
//
//   WorkloadSpec spec = RandomWorkloadSpec(seed, RandomSpecOptions{...});
//   ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(backend, options));
//   ASSERT_OK_AND_ASSIGN(WorkloadResult result,
//                        RunWorkload(backend, *offloader, spec, hooks,
//                                    WorkloadOptions{.iterations = 3}));
//   EXPECT_THAT(result.mismatches, IsEmpty());
//
// One iteration:
//   for layer i = 0..n-1:  ForwardStep(); make the layer's buffers (fresh
//     bytes each iteration); forward compute writing them; Push each saved
//     tensor; then drop every Tensor the driver made, keeping only the
//     SavedTensor handles (as autograd does), so that releasing a group frees
//     its device memory.
//   for layer i = n-1..0:  BackwardStep(i); Pop each handle; backward compute
//     reading the popped tensors; check their dtype, shape, strides, name and
//     flags at once, and enqueue a capture of their bytes on the compute
//     stream; drop them.
//   FinishBackward(); synchronize the compute stream (the only host wait of
//   the iteration); compare the captured bytes with bytes computed on the
//   host from each buffer's seed.
//
// How the driver touches the device is injected (WorkloadHooks): compute,
// tensor creation and byte capture, so the same driver runs on the simulator
// (workload/sim_compute.h) and on a real GPU.
//
// The spec types and generators are in workload/workload_spec.h, the default
// byte capture in workload/tensor_capture.h; this header includes both.

#ifndef OFFLOAD_WORKLOAD_WORKLOAD_H_
#define OFFLOAD_WORKLOAD_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "workload/tensor_capture.h"
#include "workload/workload_spec.h"

namespace offload {

// ---------------------------------------------------------------------------
// How the driver touches the device.

// One kernel of the model.
struct ComputeCall {
  std::string name;  // "forward L3", "backward L3"
  int64_t duration_ns = 0;
  std::vector<const Tensor*> reads;   // valid during the call only
  std::vector<const Tensor*> writes;  // valid during the call only
};

// Enqueues `call` on `stream` (the compute stream). Must not block.
using ComputeFn = std::function<Status(Stream& stream, const ComputeCall& call)>;

// Makes a contiguous device tensor whose storage byte i is
// PatternByte(i, seed), ready on the compute stream; MakeDeviceTensor's
// contract (workload/tensor_util.h).
using MakeTensorFn = std::function<StatusOr<Tensor>(
    Backend& backend, DType dtype, std::vector<int64_t> shape, uint64_t seed)>;

// Where the driver is in an iteration, for timelines.
enum class WorkloadPhase {
  kForwardBegin,       // before ForwardStep
  kBuffersMade,        // the layer's buffers were made
  kForwardComputed,    // its forward compute was enqueued
  kPushed,             // all its saves were pushed
  kBackwardBegin,      // before BackwardStep
  kPopped,             // all its saves were popped
  kBackwardComputed,   // its backward compute was enqueued
  kIterationEnd,       // after the synchronization and the checks
};

struct WorkloadEvent {
  WorkloadPhase phase;
  int iteration = 0;
  int layer = -1;  // -1 for kIterationEnd
};

struct WorkloadHooks {
  ComputeFn compute;         // required
  MakeTensorFn make_tensor;  // empty: MakeDeviceTensor
  CaptureFn capture;         // empty: CaptureByCopy
  // Device time in ns (e.g. SimBackend::NowNs), for iteration times.
  std::function<int64_t()> clock;
  // Called at each WorkloadPhase, on the host, synchronously.
  std::function<void(const WorkloadEvent&)> observer;
};

// What both drivers (RunWorkload, RunPipelineRank) run with: `hooks` with its
// empty make_tensor and capture replaced by their defaults above.
// Errors: kInvalidArgument "<caller>: no compute hook" if hooks.compute is
//   empty.
StatusOr<WorkloadHooks> CompleteHooks(const WorkloadHooks& hooks,
                                      const std::string& caller);

// ---------------------------------------------------------------------------
// Running it.

struct WorkloadOptions {
  int iterations = 1;
  // Capture and compare the bytes of every popped tensor.
  bool check_bytes = true;
  // The Offloader's min_offload_elements. When >= 0, tensors that must not
  // be offloaded (flagged, fewer elements, or of a layer the schedule does
  // not offload, SPEC §1.2/§4.4) must come back from Pop as the same view of
  // the same storage. -1: not checked.
  int64_t min_offload_elements = -1;
  // Accept a popped tensor whose strides are contiguous where the pushed
  // view's were not, as when the engine made a sparse view contiguous
  // (SPEC §2.2). Shape, dtype and bytes are still checked. Offloader::Pop
  // promises the pushed strides, so this is off by default.
  bool allow_made_contiguous = false;
  // For the checker's own tests: may change the expected bytes of a tensor
  // before the comparison.
  std::function<void(int iteration, int layer, const std::string& tensor,
                     std::vector<uint8_t>& expected)>
      tamper_expected;
};

// A popped tensor that differs from what was pushed.
struct Mismatch {
  int iteration = 0;
  int layer = 0;
  std::string tensor;  // the pushed tensor's name ("L2.qkv.k")
  std::string what;    // what differs

  // "iteration 0 layer 2 'L2.qkv.k': <what>".
  std::string ToString() const;
};

struct WorkloadResult {
  int iterations = 0;
  int64_t tensors_checked = 0;  // popped tensors (components) checked
  int64_t bytes_checked = 0;    // bytes compared
  int64_t tensors_kept = 0;     // popped as the very same view (not offloaded)
  std::vector<Mismatch> mismatches;
  // Device time of each iteration, from its start to the end of its
  // synchronization; empty without hooks.clock.
  std::vector<int64_t> iteration_ns;

  bool ok() const { return mismatches.empty(); }
};

// Drives `offloader` (made for spec.layers.size() model layers on `backend`)
// through options.iterations iterations of `spec`. Mismatches are returned
// in the result; errors are engine or backend calls that failed, with the
// iteration, layer and call in the message (then the compute stream is
// synchronized before pending captures are dropped).
// Errors: kInvalidArgument for an invalid spec, options or missing compute
//   hook; kInternal if ForwardStep returns an unexpected layer; whatever the
//   Offloader, the hooks or the backend return.
StatusOr<WorkloadResult> RunWorkload(Backend& backend, Offloader& offloader,
                                     const WorkloadSpec& spec,
                                     const WorkloadHooks& hooks,
                                     const WorkloadOptions& options);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_WORKLOAD_H_
