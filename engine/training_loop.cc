// The training loop's life cycle (training_loop.h): a pool of Offloaders,
// one per forward whose graph is alive, and the states of each iteration.
// This file has the handles (IterationRef, LoopSaved) and TrainingLoop's
// forwarding to its pool; the pool (LoopPool) is in training_loop_pool.cc,
// and both classes of the life cycle are declared in training_loop_internal.h.

#include "engine/training_loop.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/training_loop_internal.h"

namespace offload {

// --- IterationRef, LoopSaved -------------------------------------------------

IterationRef::IterationRef(std::shared_ptr<LoopIteration> iteration)
    : iteration_(std::move(iteration)) {
  if (iteration_ != nullptr) ++iteration_->refs;
}
IterationRef::IterationRef(const IterationRef& other)
    : IterationRef(other.iteration_) {}
IterationRef& IterationRef::operator=(const IterationRef& other) {
  if (this != &other) {
    IterationRef copy(other);
    *this = std::move(copy);
  }
  return *this;
}
IterationRef::IterationRef(IterationRef&& other) noexcept
    : iteration_(std::move(other.iteration_)) {}
IterationRef& IterationRef::operator=(IterationRef&& other) noexcept {
  if (this != &other) {
    Reset();
    iteration_ = std::move(other.iteration_);
  }
  return *this;
}
IterationRef::~IterationRef() { Reset(); }
uint64_t IterationRef::id() const {
  return iteration_ == nullptr ? 0 : iteration_->id;
}
void IterationRef::Reset() {
  std::shared_ptr<LoopIteration> iteration = std::move(iteration_);
  if (iteration != nullptr && --iteration->refs == 0) {
    iteration->pool->OnUnreferenced(*iteration);
  }
}

LoopSaved::LoopSaved(IterationRef ref, SavedTensor saved)
    : ref_(std::move(ref)), saved_(std::move(saved)), counted_(true) {}
LoopSaved::LoopSaved(LoopSaved&& other) noexcept
    : ref_(std::move(other.ref_)),
      saved_(std::move(other.saved_)),
      counted_(other.counted_) {
  other.counted_ = false;
}
LoopSaved& LoopSaved::operator=(LoopSaved&& other) noexcept {
  if (this != &other) {
    Release();
    ref_ = std::move(other.ref_);
    saved_ = std::move(other.saved_);
    counted_ = other.counted_;
    other.counted_ = false;
  }
  return *this;
}
LoopSaved::~LoopSaved() { Release(); }
void LoopSaved::Release() {
  if (counted_ && ref_.iteration_ != nullptr) {
    counted_ = false;
    LoopIteration& iteration = *ref_.iteration_;
    if (--iteration.handles == 0) iteration.pool->OnHandlesGone(iteration);
  }
  counted_ = false;
  ref_.Reset();
}

LoopIteration::~LoopIteration() {
  if (state != LoopState::kDone) pool->OnDestroyed(*this);
}

// --- TrainingLoop -----------------------------------------------------------

StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(
    Backend& backend, const OffloadOptions& options,
    std::function<bool()> backward_running) {
  // Checks the options once; the pool makes the same ones later.
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Offloader> probe,
                           Offloader::Create(backend, options));
  probe.reset();
  return std::unique_ptr<TrainingLoop>(
      new TrainingLoop(std::make_shared<LoopPool>(
          backend, options, std::move(backward_running))));
}

TrainingLoop::TrainingLoop(std::shared_ptr<LoopPool> pool)
    : pool_(std::move(pool)) {}
TrainingLoop::~TrainingLoop() { pool_->Close(); }

StatusOr<LoopLayer> TrainingLoop::ForwardStep(int expected) {
  return pool_->ForwardStep(expected);
}
Status TrainingLoop::AbandonForward() { return pool_->AbandonForward(); }
void TrainingLoop::EndForward() { pool_->EndForward(); }
void TrainingLoop::EndLayer() { pool_->EndLayer(); }
const Diagnostics& TrainingLoop::diagnostics() const {
  return pool_->diagnostics();
}
StatusOr<TrainingLoop::Pushed> TrainingLoop::Push(const Tensor& tensor) {
  return pool_->Push(tensor);
}
StatusOr<Tensor> TrainingLoop::Pop(const LoopSaved& saved, int begin_layer) {
  return pool_->Pop(saved, begin_layer);
}
Status TrainingLoop::BackwardStep(const IterationRef& iteration, int layer) {
  if (iteration.empty()) {
    return InvalidArgumentError("BackwardStep: an empty IterationRef");
  }
  return pool_->BackwardStep(*iteration.iteration_, layer);
}
Status TrainingLoop::PassEnded() { return pool_->PassEnded(); }
int TrainingLoop::pooled_offloaders() const { return pool_->pooled(); }
int TrainingLoop::live_iterations() const { return pool_->live(); }
int64_t TrainingLoop::OffloadedBytes() const { return pool_->OffloadedBytes(); }
std::vector<std::string> TrainingLoop::Warnings() const {
  return pool_->Warnings();
}
const Offloader* TrainingLoop::current_offloader() const {
  return pool_->Current();
}
const Offloader* TrainingLoop::offloader(const IterationRef& iteration) const {
  return iteration.empty() ? nullptr : pool_->Of(*iteration.iteration_);
}
std::vector<const Offloader*> TrainingLoop::offloaders() const {
  return pool_->All();
}
bool TrainingLoop::offloading() const { return pool_->offloading(); }
Offloader* TrainingLoop::manual_target() { return pool_->ManualTarget(); }

}  // namespace offload
