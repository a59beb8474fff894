// The layer-mode front door, after Transformer Engine's
// get_cpu_offload_context (SPEC §1–§4).
//
// One Offloader serves a stack of `model_layers` layers. The caller drives it
// like TE's hooks:
//
//   for each iteration:
//     for layer in 0..n-1:   ForwardStep();  ...  saved = Push(t) ...
//     for layer in n-1..0:   BackwardStep(layer);  ...  t = Pop(saved) ...
//     FinishBackward();
//
// Push is the saved-tensor pack hook and Pop the unpack hook. Which layers are
// offloaded, and when their memory is released and reloaded, follows the
// schedule (default k-of-n, a ScheduleTable, or manual calls).
//
// Streams: the model runs on backend.ComputeStream(); copies run on a D2H and
// an H2D stream the Offloader creates (or on `offload_stream` in manual mode).
// Every call returns a Status; a failed call changes nothing, except where
// its comment says what it did before failing. No call blocks the host
// (CUDA graph capture can record them all), except ~Offloader after an
// ordering call (Wait, Record) failed: it then drains the copy stream
// before freeing the memory that ordering call should have protected.
//
// How a group moves is the shared mechanism of engine/core (OffloadGroup,
// OffloadCore); when it moves is the policy's (engine/layer: TE's
// schedules; engine/budget: the byte budget). This class checks the
// options, picks the policy and forwards to it.

#ifndef OFFLOAD_ENGINE_OFFLOAD_H_
#define OFFLOAD_ENGINE_OFFLOAD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/diagnostics.h"
#include "engine/offload_options.h"
#include "engine/saved_tensor.h"
#include "engine/schedule.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class OffloaderPolicy;  // engine/policy/offloader_policy.h, private

class Offloader {
 public:
  // Errors: kInvalidArgument for inconsistent options: model_layers outside
  //   [1, kMaxModelLayers] (schedule.h), an offload_stream of another
  //   backend,
  //   offloaded_layers outside [0, model_layers - 1] (with default
  //   scheduling), an invalid schedule table, offload_stream without manual
  //   synchronization, min_offload_elements < 0, min_span_coverage outside
  //   [0, 1], activation_budget_bytes <= 0 or with manual synchronization
  //   or a schedule table. offloaded_layers == model_layers - 1 is allowed
  //   with a warning (no overlap is possible).
  static StatusOr<std::unique_ptr<Offloader>> Create(Backend& backend,
                                                     const OffloadOptions& options);
  ~Offloader();
  Offloader(const Offloader&) = delete;
  Offloader& operator=(const Offloader&) = delete;

  // Before each layer's forward: closes the previous layer's group (starting
  // its offload), releases layers whose offload must finish now, and returns
  // the id of the layer starting (0, 1, ... n-1 in each iteration).
  // Errors: kFailedPrecondition after all n forwards of the iteration (call
  //   BackwardStep / FinishBackward first); what a release due now returns
  //   (an ordering Wait that failed). Then the previous layer's forward is
  //   already closed (its offload started, or it is kept on device) and no
  //   layer is open; calling ForwardStep again does what is left and
  //   returns the same layer id. kInvalidArgument naming the previous
  //   layer when retain_pinned_buffers is set and its saved tensors changed
  //   shape since the iteration that sized its pinned buffers (SPEC §3.5,
  //   TE's ValueError): that layer stays on device in this iteration
  //   (correct as pushed), its retained buffers go back, and the next
  //   iteration sizes new ones; retry ForwardStep as above.
  StatusOr<int> ForwardStep();

  // Before the backward of `layer`: releases the previous backward layer's
  // memory, starts the reloads the schedule puts here.
  // Errors: kInvalidArgument for a layer outside [0, n); kFailedPrecondition
  //   if its forward has not run this iteration or its backward already
  //   began; kResourceExhausted if a reload cannot get device memory. Then
  //   the layer's backward has not begun and the host copy is kept; the
  //   step's releases (the previous backward layer's memory, and layers due
  //   now), which only free memory, have happened. Call again to retry.
  //   kInvalidArgument when the last forward layer, which this call
  //   closes, hit SPEC §3.5's retain rule (as ForwardStep): that layer
  //   stays on device; the backward has not begun; call again to go on.
  Status BackwardStep(int layer);

  // After a backward pass: releases the last backward layer's memory and
  // ends the iteration; the next ForwardStep starts layer 0 again. The pass
  // may have stopped before layer 0 (frozen first layers, a detached input,
  // backward(inputs=...)): every layer is released all the same.
  // Errors: kFailedPrecondition if no BackwardStep was taken in the
  //   iteration (use AbandonIteration); an ordering call failed (the
  //   iteration ended all the same, that memory is kept and warned).
  Status FinishBackward();

  // SPEC §7.2: the caller drops the iteration wherever it is (in the
  // middle of a forward, after it, in its backward): every group is
  // released, each free ordered after the copies that read it, a warning
  // names the iteration and how far it got (none where it holds nothing:
  // no tensor offloaded by a layer schedule, none pushed under a byte
  // budget), and the next ForwardStep
  // starts layer 0 of a new iteration. A byte budget's recording iteration
  // is discarded (the next one records again). An OK no-op between
  // iterations. Handles of the dropped iteration are refused by Pop.
  // Errors: kFailedPrecondition during a warm-up or a graph capture
  //   (nothing changed); an ordering call failed (the iteration ended all
  //   the same, that memory is kept and warned).
  Status AbandonIteration();

  // SPEC §7.3: a backward pass over the iteration ended, but its graph
  // lives on and may be traversed again (PyTorch's retain_graph). Reloaded
  // memory is released (popped tensors the caller still holds go with
  // their last holder); host copies stay; the next BackwardStep, of any
  // layer that ran forward, begins another traversal whose schedule
  // reloads the offloaded layers again. FinishBackward (no BackwardStep
  // needed after an EndTraversal) or AbandonIteration ends the iteration.
  // With keep_host_copies, a Pop of a layer whose device memory was
  // released and whose reload has not started (a traversal in another
  // order than the schedule's) starts the reload itself. An OK no-op when
  // disabled.
  // Errors: kFailedPrecondition without keep_host_copies, or if no
  //   BackwardStep ran since the iteration's last traversal (nothing
  //   changed); an ordering call failed (the traversal ended all the same,
  //   that memory is kept and warned).
  Status EndTraversal();

  // The saved-tensor pack hook. Tensors that are never offloaded (SPEC §1.2)
  // and all tensors of layers that will not be offloaded come back from Pop
  // unchanged. A composite is pushed whole or not at all.
  // Errors: kFailedPrecondition if no layer's forward is open;
  //   kInvalidArgument for a malformed tensor (tensor.h's ValidateTensor)
  //   or, for a tensor the group would copy, a storage or ready event of
  //   another backend; what recording its ready point returns.
  StatusOr<SavedTensor> Push(const Tensor& tensor);
  StatusOr<SavedTensor> Push(const CompositeTensor& tensor);

  // The saved-tensor unpack hook: the tensor as pushed (same dtype, shape,
  // strides, flags, name and logical bytes; possibly on new storage at a new
  // offset). One exception, as in TE: a sparse view that StartOffload made
  // contiguous (SPEC §2.2, announced by a warning) comes back contiguous —
  // same shape and bytes, dense strides. A reloaded tensor makes the compute
  // stream wait for its own span's reload only.
  // Errors: kInvalidArgument for a handle of another Offloader or iteration,
  //   or a composite passed to Pop (use PopComposite) and vice versa;
  //   kFailedPrecondition if the group's device memory was released and its
  //   reload never started, or the group was already released. A refused
  //   handle changes nothing. With a byte budget, Pop first runs the frees
  //   and reloads the plan puts at this call; if the pop itself then fails
  //   (an ordering call or an allocation), those stay done — they are the
  //   plan's, and the retry does not repeat them — and nothing else changed
  //   (props/budget_fault_props_test).
  StatusOr<Tensor> Pop(const SavedTensor& saved);
  StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved);

  // Manual synchronization only (kFailedPrecondition otherwise; OK no-ops
  // when offloading is disabled), SPEC §4.3. Each needs the layer's forward
  // to have begun in this iteration and its group in the state before the
  // call; errors name the layer and its state. StartOffload of the layer
  // whose forward is open closes it, as TE's manual example does: pushes
  // before the next ForwardStep then fail. StartOffload of a layer whose
  // backward began is kFailedPrecondition.
  // StartOffload is kInvalidArgument when retain_pinned_buffers is set and
  // the layer's saved tensors changed shape (as ForwardStep): the layer is
  // then kept on device for this iteration, and closed.
  Status StartOffload(int layer);
  Status ReleaseForwardMemory(int layer);
  Status StartReload(int layer);

  // Host bytes held for offloaded groups (pinned buffers, including
  // retained ones).
  int64_t OffloadedBytes() const;
  const Diagnostics& diagnostics() const;

  // Extensions.
  GroupState state(int layer) const;
  const OffloaderStats& stats() const;
  // The schedule in use (empty in manual mode).
  const ScheduleTable& schedule() const;
  // Whether `layer` is offloaded by the schedule (manual: every layer may be;
  // byte budget: the plan offloads some of its tensors).
  bool WillOffload(int layer) const;
  // Byte budget (SPEC §4.7): the plan in force as a table
  // (FormatBudgetPlan); empty before it is made and in the other modes.
  std::string BudgetPlanText() const;
  // Recompute (SPEC §4.8, OffloadOptions::recompute): whether the caller
  // recomputes `layer`. If so, in the forward it pushes only what the layer
  // keeps when recomputed (its input) and drops the rest; in the backward,
  // after BackwardStep(layer) and the input's Pop, it re-runs the layer's
  // forward without pushing, uses the re-created tensors for the layer's
  // backward and drops them before the next BackwardStep. False without a
  // plan, for a layer out of range, and when disabled.
  bool Recompute(int layer) const;
  // The joint plan as a table (FormatJointPlan); empty without one.
  std::string JointPlanText() const;

  // --- CUDA graph capture (SPEC §5.7; TE's "CPU offloading and CUDA
  // graphs"). Whole iterations of the layer policies (default k-of-n, a
  // schedule table, manual calls) can be captured once and launched many
  // times:
  //
  //   BeginWarmup();  one or more iterations  EndWarmup();
  //   BeginCapture(); one iteration (nothing runs)  graph = EndCapture();
  //   exec = backend.Instantiate(*graph);
  //   per step: write new inputs; backend.Launch(*exec, compute);
  //
  // A launch runs the step's copies, records, waits and device allocations
  // exactly as captured, with no host work per step. The byte budget cannot
  // be captured (its first iteration records on the host).

  // Warm-up iterations run the step's calls with every check, but nothing is
  // offloaded (Push and Pop hand tensors back as pushed): TE's and
  // Megatron's pre- and post-warm-up hooks. Each layer the schedule (or a
  // manual StartOffload) would offload records the pinned memory its
  // offload needs, for BeginCapture.
  // Errors: kFailedPrecondition in the middle of an iteration, when already
  //   warming up (BeginWarmup) or not (EndWarmup), during a capture, or with
  //   a byte budget.
  Status BeginWarmup();
  Status EndWarmup();

  // Makes the pinned buffers the last warm-up recorded (allocating what the
  // pool lacks; they stay pooled, as with retain_pinned_buffers, for the
  // life of the Offloader since the graph refers to them), waits on the
  // host until pooled buffers are no longer read by earlier copies (the
  // last host wait before the capture), then begins capturing the compute
  // stream (Backend::BeginCapture). During the capture the engine enqueues
  // only stream work; a layer that could not be offloaded in it (its pinned
  // buffers differ from the warm-up's) makes EndCapture fail.
  // Errors: kUnimplemented if the backend has no graphs; kFailedPrecondition
  //   in the middle of an iteration, during warm-up or a capture, with a byte
  //   budget, or when a layer that will be offloaded has no warm-up record;
  //   what AllocatePinned, Event::Synchronize or BeginCapture return (then
  //   no capture runs; buffers already allocated stay pooled).
  Status BeginCapture(CaptureMode mode = CaptureMode::kGlobal);

  // Ends the capture and returns its graph. Every copy the capture started
  // must complete inside it (TE's rule for offloading in graphs): a capture
  // holds whole iterations.
  // Errors: kFailedPrecondition without a capture, or in the middle of an
  //   iteration (the message names the layers whose copies would be left
  //   unfinished; the capture goes on: finish the iteration and call again);
  //   kFailedPrecondition naming the layers kept on device during the capture
  //   (the capture has ended and its graph is dropped); what the backend's
  //   EndCapture returns (the capture has ended).
  StatusOr<std::unique_ptr<Graph>> EndCapture();

  bool warming_up() const;
  bool capturing() const;

 private:
  explicit Offloader(std::unique_ptr<OffloaderPolicy> policy);

  // TE's schedules (engine/layer/) or the byte budget (engine/budget/).
  std::unique_ptr<OffloaderPolicy> policy_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_OFFLOAD_H_
