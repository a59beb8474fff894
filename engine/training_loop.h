// TrainingLoop: the layer-mode front door (offload.h) as a training loop's
// autograd drives it (SPEC §7).
//
// An autograd framework says when a layer's forward begins and when its
// backward begins, but never "the iteration ended": a backward pass may
// stop before layer 0 (frozen first layers, a detached input,
// backward(inputs=...)), a graph may be traversed twice (retain_graph,
// gradient penalties) or never (an exception, a skipped batch, an
// evaluation with grad on), and several forwards may run before one
// backward (contrastive losses). What it does say is when a backward pass
// ended and when a saved tensor, or the whole graph, was freed.
//
// So each forward is an iteration of its own Offloader, taken from a pool,
// and the graph holds it: every saved handle and every layer-end marker the
// caller puts in the graph holds an IterationRef. The iteration's life:
//
//   forward ──BackwardStep──▶ in a pass ──PassEnded──▶ done     (no saved
//      │                        ▲    │                            handle left)
//      │                        │    └──PassEnded──▶ retained  (handles
//      │                        └────BackwardStep───────┘       left)
//      └── graph freed, or AbandonForward ──▶ abandoned (warned)
//
// A pass that raised stays "in a pass" until the next PassEnded, or, when
// the loop is told whether a backward runs, until its graph is freed
// outside one (Create).
//
// done, abandoned, and a retained iteration whose last saved handle or
// whose graph goes, give their Offloader back to the pool, its memory
// released (FinishBackward or AbandonIteration, ordered as the Offloader
// orders them); the next forward reuses it, so its pinned buffers and a
// byte budget's plan carry over. Without OffloadOptions::keep_host_copies
// an iteration with saved handles left when its pass ends is done all the
// same, and a later traversal's Pop is refused with that reason.
//
// Single-threaded, like autograd's hooks into it. The Backend must outlive
// the loop and every IterationRef and Saved it made.

#ifndef OFFLOAD_ENGINE_TRAINING_LOOP_H_
#define OFFLOAD_ENGINE_TRAINING_LOOP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/diagnostics.h"
#include "engine/offload.h"
#include "engine/offload_options.h"
#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class LoopPool;       // training_loop_internal.h
class LoopIteration;  // training_loop_internal.h

// A reference to one forward's iteration, as its graph holds it. Copyable;
// when the last reference goes, the graph was freed.
class IterationRef {
 public:
  IterationRef() = default;
  IterationRef(const IterationRef& other);
  IterationRef& operator=(const IterationRef& other);
  IterationRef(IterationRef&& other) noexcept;
  IterationRef& operator=(IterationRef&& other) noexcept;
  ~IterationRef();

  bool empty() const { return iteration_ == nullptr; }
  // 1, 2, ... in the order forwards began; 0 when empty.
  uint64_t id() const;

 private:
  friend class TrainingLoop;
  friend class LoopPool;
  friend class LoopSaved;
  explicit IterationRef(std::shared_ptr<LoopIteration> iteration);
  void Reset();
  std::shared_ptr<LoopIteration> iteration_;
};

// A tensor Push handed to the engine, as the graph holds it (the pack
// hook's result). Move-only: it counts as one saved handle of its
// iteration until destroyed.
class LoopSaved {
 public:
  LoopSaved() = default;
  LoopSaved(LoopSaved&& other) noexcept;
  LoopSaved& operator=(LoopSaved&& other) noexcept;
  LoopSaved(const LoopSaved&) = delete;
  LoopSaved& operator=(const LoopSaved&) = delete;
  ~LoopSaved();

  const IterationRef& iteration() const { return ref_; }
  const SavedTensor& saved() const { return saved_; }

 private:
  friend class LoopPool;
  LoopSaved(IterationRef ref, SavedTensor saved);
  void Release();
  IterationRef ref_;
  SavedTensor saved_;
  bool counted_ = false;
};

// What ForwardStep says of the layer starting.
struct LoopLayer {
  IterationRef iteration;  // empty when `layer` < 0
  // The layer's id in its iteration; -1: it runs outside offloading (its
  // saved tensors stay on device).
  int layer = -1;
  // Whether the engine may offload its tensors (Offloader::WillOffload).
  bool offloaded = false;
};

class TrainingLoop {
 public:
  // `backward_running`, when given, says whether the framework's backward
  // pass runs on this thread now (autograd's current graph task). A pass
  // that raised never ends (no end callback runs): with it, an iteration
  // whose graph is freed while its pass is open and no backward runs ends
  // then, and its memory (what the pass reloaded, the host copies) goes
  // with its graph. Without it, that iteration ends at the next PassEnded
  // (the package calls it at the next forward: end_stale_pass).
  // Errors: what Offloader::Create returns for `options` (checked once
  //   here: every pooled Offloader is made with them).
  static StatusOr<std::unique_ptr<TrainingLoop>> Create(
      Backend& backend, const OffloadOptions& options,
      std::function<bool()> backward_running = nullptr);
  // Iterations whose graphs live on keep what they need (the pool stays
  // until the last one goes).
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  // Before a layer's forward. `expected` is the layer the caller knows is
  // starting (a module's pre-hook) or -1 (the next one: TE's context).
  // Begins a new iteration (a pooled Offloader's ForwardStep at layer 0)
  // when none is running forward: the last one ran all its layers, began
  // its backward, was abandoned, or its graph was freed in the middle of
  // the forward (then it is abandoned now, warned); also when `expected`
  // is 0. A layer whose `expected` id is not the iteration's next runs
  // outside offloading: layer -1, warned once per iteration.
  // Errors: what Offloader::ForwardStep returns (the iteration is then
  //   abandoned: nothing stays stuck).
  StatusOr<LoopLayer> ForwardStep(int expected = -1);

  // The running layer's forward failed (an exception inside it): its
  // iteration is abandoned now (warned), whatever holds it. An OK no-op
  // when no forward runs. Errors: what AbandonIteration returns (the
  // iteration is abandoned all the same).
  Status AbandonForward();

  // Ends the running forward: the next ForwardStep begins a new iteration
  // (a caller that knows where its forward ends: a context's exit).
  void EndForward();
  // The open layer's forward ended (a module's forward hook): tensors saved
  // until the next ForwardStep stay on device.
  void EndLayer();

  // The pack hook. Tensors the engine does not take (SPEC §1.2, kept-on-
  // device layers, no layer open) come back with `kept` set and no
  // LoopSaved, except under a byte budget, whose backward passes must be
  // seen even when they reach only kept tensors; the rest as a LoopSaved.
  struct Pushed {
    bool kept = true;
    LoopSaved saved;
  };
  // Errors: what Offloader::Push returns (nothing was saved).
  StatusOr<Pushed> Push(const Tensor& tensor);

  // The unpack hook. `begin_layer` >= 0: first begin that layer's backward
  // in this pass if it has not begun (a forward without layer-end markers:
  // the whole forward is layer 0).
  // Errors: kFailedPrecondition naming the iteration when it already ended
  //   (its pass ended without keep_host_copies and another traversal came);
  //   what BackwardStep or Offloader::Pop return.
  StatusOr<Tensor> Pop(const LoopSaved& saved, int begin_layer = -1);

  // A layer's backward begins (the gradient reached its layer-end marker).
  // An OK no-op for an iteration already done (autograd then raises its own
  // error for a graph traversed twice without retain_graph).
  // Errors: what Offloader::BackwardStep returns.
  Status BackwardStep(const IterationRef& iteration, int layer);

  // Autograd's backward pass ended: each iteration it reached ends
  // (FinishBackward) or, with saved handles left, is retained for another
  // traversal (EndTraversal). Errors: the first failed call (every
  // iteration was handled all the same).
  Status PassEnded();

  // Introspection (tests, the package's stats).
  int pooled_offloaders() const;
  int live_iterations() const;   // not yet done or abandoned
  int64_t OffloadedBytes() const;  // over every pooled Offloader
  // The loop's warnings (abandoned iterations, layers run outside
  // offloading) followed by those of every pooled Offloader.
  std::vector<std::string> Warnings() const;
  // The Offloader of the iteration running forward or, if none, of the
  // last one made (for plans and stats); nullptr before any forward.
  const Offloader* current_offloader() const;
  // The Offloader serving `iteration`; nullptr once it is done.
  const Offloader* offloader(const IterationRef& iteration) const;
  // The loop's own warnings (abandoned iterations, layers run outside
  // offloading); Warnings() adds the Offloaders'.
  const Diagnostics& diagnostics() const;
  // Every pooled Offloader (stats summed over them, tests).
  std::vector<const Offloader*> offloaders() const;
  // Whether a Push now would reach the engine: a layer of the running
  // forward is open and the engine may offload it (SPEC §4.4: other
  // tensors skip all processing).
  bool offloading() const;
  // Manual synchronization (Offloader::StartOffload, ...): the Offloader
  // of the running forward or, once its backward began, of the last one
  // made. nullptr before any forward.
  Offloader* manual_target();

 private:
  explicit TrainingLoop(std::shared_ptr<LoopPool> pool);
  std::shared_ptr<LoopPool> pool_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_TRAINING_LOOP_H_
