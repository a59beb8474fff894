// The training loop's life cycle (training_loop.h), private to
// //engine:training_loop: the states of one iteration (LoopIteration) and
// the pool of Offloaders (LoopPool), one per forward whose graph is alive.
// The handles and TrainingLoop are in training_loop.cc, LoopPool's methods
// in training_loop_pool.cc.

#ifndef OFFLOAD_ENGINE_TRAINING_LOOP_INTERNAL_H_
#define OFFLOAD_ENGINE_TRAINING_LOOP_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/training_loop.h"

namespace offload {

enum class LoopState {
  kForward,   // its forward runs or ran; no backward yet
  kInPass,    // a backward pass reached it and has not ended
  kRetained,  // a pass ended with saved handles left: host copies stay
  kDone,      // its Offloader went back to the pool
};

class LoopIteration : public std::enable_shared_from_this<LoopIteration> {
 public:
  LoopIteration(std::shared_ptr<LoopPool> pool, uint64_t id, int offloader,
                int layers)
      : pool(std::move(pool)), id(id), offloader(offloader),
        stepped(layers, false) {}
  ~LoopIteration();

  const std::shared_ptr<LoopPool> pool;  // outlives the iteration
  const uint64_t id;
  const int offloader;  // index in the pool
  LoopState state = LoopState::kForward;
  int forward_count = 0;       // layers that began their forward
  bool forward_ended = false;  // ForwardStep begins a new iteration
  bool had_handles = false;
  bool graph_dropped = false;  // its saved handles went during its forward
  bool warned_outside = false;
  int refs = 0;     // IterationRefs (the graph's, and callers')
  int handles = 0;  // LoopSaved (the graph's saved tensors)
  std::vector<bool> stepped;  // layers whose backward began in this pass
  std::string done_reason;
};

class LoopPool : public std::enable_shared_from_this<LoopPool> {
 public:
  LoopPool(Backend& backend, const OffloadOptions& options,
           std::function<bool()> backward_running)
      : backend_(backend),
        options_(options),
        backward_running_(std::move(backward_running)) {}

  StatusOr<LoopLayer> ForwardStep(int expected);
  Status AbandonForward();
  void EndForward();
  StatusOr<TrainingLoop::Pushed> Push(const Tensor& tensor);
  StatusOr<Tensor> Pop(const LoopSaved& saved, int begin_layer);
  Status BackwardStep(LoopIteration& iteration, int layer);
  Status PassEnded();
  // ~TrainingLoop: the caller lets go of the running forward.
  void Close();

  // From IterationRef and LoopSaved.
  void OnUnreferenced(LoopIteration& iteration);
  void OnHandlesGone(LoopIteration& iteration);
  // ~LoopIteration of one never ended (a backstop).
  void OnDestroyed(LoopIteration& iteration);

  int pooled() const { return static_cast<int>(offloaders_.size()); }
  std::vector<const Offloader*> All() const {
    std::vector<const Offloader*> all;
    for (const auto& offloader : offloaders_) all.push_back(offloader.get());
    return all;
  }
  void EndLayer() { layer_offloaded_ = false; }
  const Diagnostics& diagnostics() const { return diagnostics_; }
  bool offloading() const {
    return current_ != nullptr && current_->state == LoopState::kForward &&
           layer_offloaded_;
  }
  Offloader* ManualTarget() {
    if (current_ != nullptr) return offloaders_[current_->offloader].get();
    return last_offloader_ >= 0 ? offloaders_[last_offloader_].get() : nullptr;
  }
  int live() const { return static_cast<int>(live_.size()); }
  int64_t OffloadedBytes() const;
  std::vector<std::string> Warnings() const;
  const Offloader* Current() const;
  const Offloader* Of(const LoopIteration& iteration) const {
    return iteration.state == LoopState::kDone
               ? nullptr
               : offloaders_[iteration.offloader].get();
  }

 private:
  Offloader& OffloaderOf(const LoopIteration& iteration) {
    return *offloaders_[iteration.offloader];
  }
  // A new iteration on an idle Offloader (made if none is idle).
  Status Begin();
  // Where no caller can be told (a graph freed, a forward detached): a
  // failed end is a warning; its memory is kept by the Offloader (warned
  // there too), never freed unordered.
  void Note(const Status& status) {
    if (!status.ok()) diagnostics_.Warn("ending an iteration: " + status.ToString());
  }
  // Lets go of the running forward; abandons it if nothing holds it.
  void DetachCurrent();
  // Ends `iteration` and gives its Offloader back: FinishBackward, or
  // AbandonIteration when `abandon` (warned by the Offloader when it had
  // begun). `reason` is what a later Pop is told.
  Status End(LoopIteration& iteration, bool abandon, std::string reason);

  Backend& backend_;
  const OffloadOptions options_;
  // TrainingLoop::Create's; may be empty.
  const std::function<bool()> backward_running_;
  Diagnostics diagnostics_;
  std::vector<std::unique_ptr<Offloader>> offloaders_;
  std::vector<int> idle_;
  std::shared_ptr<LoopIteration> current_;  // running forward
  std::vector<LoopIteration*> live_;        // not done
  // Reached by the running pass, held until it ends (their saved handles
  // may all go during it).
  std::vector<std::shared_ptr<LoopIteration>> pass_;
  uint64_t next_id_ = 1;
  int last_offloader_ = -1;
  bool layer_offloaded_ = false;  // the open layer's (offloading())
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_TRAINING_LOOP_INTERNAL_H_
