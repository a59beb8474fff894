// One training step of a layer stack through an Offloader, the loop every
// caller of the layer-mode API writes:
//
//   for layer 0..n-1:   ForwardStep() (must return layer); hooks.forward(layer)
//   hooks.after_forward()
//   for layer n-1..0:   BackwardStep(layer); hooks.backward(layer)
//   FinishBackward()
//
// The hooks do the model's part: make the layer's tensors, enqueue its
// compute, Push the saved tensors (forward); Pop them and enqueue the
// backward compute (backward). The driver makes no other call.
//
//   LayerLoopHooks hooks;
//   hooks.forward = [&](int layer) -> Status { ... offloader.Push(t) ... };
//   hooks.backward = [&](int layer) -> Status { ... offloader.Pop(h) ... };
//   OFFLOAD_RETURN_IF_ERROR(RunLayerStep(offloader, layers, hooks));
//
// RunForwardPass and RunBackwardPass are the two halves, for callers that
// do something of their own between them.

#ifndef OFFLOAD_WORKLOAD_LAYER_LOOP_H_
#define OFFLOAD_WORKLOAD_LAYER_LOOP_H_

#include <chrono>
#include <functional>

#include "engine/offload.h"
#include "engine/status.h"

namespace offload {

// The Offloader calls the driver makes itself.
enum class LayerCall { kForwardStep, kBackwardStep, kFinishBackward };

struct LayerLoopHooks {
  // Required. The forward of `layer`, after ForwardStep returned it.
  std::function<Status(int layer)> forward;
  // Required. The backward of `layer`, after BackwardStep(layer) succeeded.
  std::function<Status(int layer)> backward;
  // Optional. Between the passes (e.g. the output and the loss).
  std::function<Status()> after_forward;
  // Optional. Called on the host just before each LayerCall; `layer` is -1
  // for FinishBackward.
  std::function<void(LayerCall call, int layer)> before_call;
  // Optional. The wall time (steady_clock) of each LayerCall, measured
  // around the Offloader call alone; called once it returned, failed or
  // not. Unset: the driver reads no clock.
  std::function<void(LayerCall call, int layer,
                     std::chrono::steady_clock::duration took)>
      timed;
};

// Runs the forward pass, hooks.after_forward, and the backward pass with
// FinishBackward, over layers 0..layers-1. OK: every call and hook
// succeeded and the iteration ended (the next ForwardStep starts layer 0).
// Stops at the first error.
// Errors name the layer and the step, so that a caller can put its own
// prefix ("iteration 2 ") in front:
//   "layer 3 ForwardStep: <error>", "layer 3 forward: <hook's error>",
//   "after forward: <hook's error>", "layer 3 BackwardStep: <error>",
//   "layer 3 backward: <hook's error>", "FinishBackward: <error>";
//   kInternal "layer 3 ForwardStep returned layer 5" if ForwardStep returns
//   another layer than the next one. On error the Offloader is left where
//   the failing call left it (the step is not finished).
// REQUIRES: hooks.forward and hooks.backward are set; `offloader` serves
//   `layers` model layers and is at the start of an iteration.
Status RunLayerStep(Offloader& offloader, int layers,
                    const LayerLoopHooks& hooks);

// The forward half: ForwardStep and hooks.forward for layers 0..layers-1
// (hooks.backward and hooks.after_forward are not used). OK: all `layers`
// forwards ran, the last one is still open for pushes until the next
// Offloader step call. Errors as above.
// REQUIRES: hooks.forward is set; the offloader's next ForwardStep starts
//   layer 0.
Status RunForwardPass(Offloader& offloader, int layers,
                      const LayerLoopHooks& hooks);

// The backward half: BackwardStep and hooks.backward for layers
// layers-1..0, then FinishBackward (hooks.forward and hooks.after_forward
// are not used). OK: the iteration ended. Errors as above.
// REQUIRES: hooks.backward is set; the forward of all `layers` layers ran
//   in this iteration.
Status RunBackwardPass(Offloader& offloader, int layers,
                       const LayerLoopHooks& hooks);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_LAYER_LOOP_H_
