// The training loop's life cycle (training_loop.h): a pool of Offloaders,
// one per forward whose graph is alive, and the states of each iteration.

#include "engine/training_loop.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  LoopPool(Backend& backend, const OffloadOptions& options)
      : backend_(backend), options_(options) {}

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

// --- LoopPool ---------------------------------------------------------------

Status LoopPool::Begin() {
  int index;
  if (!idle_.empty()) {
    index = idle_.back();
    idle_.pop_back();
  } else {
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Offloader> made,
                             Offloader::Create(backend_, options_));
    offloaders_.push_back(std::move(made));
    index = static_cast<int>(offloaders_.size()) - 1;
  }
  current_ = std::make_shared<LoopIteration>(shared_from_this(), next_id_++,
                                             index, options_.model_layers);
  live_.push_back(current_.get());
  last_offloader_ = index;
  return OkStatus();
}

void LoopPool::DetachCurrent() {
  std::shared_ptr<LoopIteration> iteration = std::move(current_);
  if (iteration == nullptr || iteration->state == LoopState::kDone) return;
  iteration->forward_ended = true;
  if (iteration->refs == 0 && iteration->state == LoopState::kForward) {
    // Nothing in a graph holds it: no backward can come.
    Note(End(*iteration, /*abandon=*/true,
        "its forward's graph was freed without a backward"));
  }
}

StatusOr<LoopLayer> LoopPool::ForwardStep(int expected) {
  if (current_ != nullptr) {
    LoopIteration& running = *current_;
    if (running.graph_dropped && running.state == LoopState::kForward) {
      diagnostics_.Warn("iteration " + std::to_string(running.id) +
                        ": its saved tensors were freed in the middle of its "
                        "forward (an exception, or a detached graph); the "
                        "next layer begins a new iteration");
      Note(End(running, /*abandon=*/true,
          "its graph was freed in the middle of its forward"));
      current_.reset();
    } else if (running.forward_ended || expected == 0 ||
               running.forward_count == options_.model_layers) {
      DetachCurrent();
    }
  }
  if (current_ == nullptr) OFFLOAD_RETURN_IF_ERROR(Begin());
  LoopIteration& iteration = *current_;
  if (expected >= 0 && expected != iteration.forward_count) {
    if (!iteration.warned_outside) {
      iteration.warned_outside = true;
      diagnostics_.Warn(
          "iteration " + std::to_string(iteration.id) + ": layer " +
          std::to_string(expected) + " began its forward where layer " +
          std::to_string(iteration.forward_count) +
          " was next (a layer run twice or skipped); it runs outside "
          "offloading, its saved tensors stay on device");
    }
    layer_offloaded_ = false;
    return LoopLayer{};
  }
  layer_offloaded_ = false;
  StatusOr<int> layer = OffloaderOf(iteration).ForwardStep();
  if (!layer.ok()) {
    std::shared_ptr<LoopIteration> failed = std::move(current_);
    Note(End(*failed, /*abandon=*/true, "its forward failed"));
    return layer.status();
  }
  ++iteration.forward_count;
  LoopLayer out;
  out.iteration = IterationRef(current_);
  out.layer = *layer;
  // A byte budget records every push of its first iteration.
  out.offloaded = options_.activation_budget_bytes.has_value() ||
                  OffloaderOf(iteration).WillOffload(*layer);
  layer_offloaded_ = out.offloaded;
  return out;
}

Status LoopPool::AbandonForward() {
  std::shared_ptr<LoopIteration> running = std::move(current_);
  if (running == nullptr || running->state != LoopState::kForward) {
    return OkStatus();
  }
  return End(*running, /*abandon=*/true, "its forward raised an exception");
}

void LoopPool::EndForward() {
  layer_offloaded_ = false;
  if (current_ == nullptr) return;
  current_->forward_ended = true;
  // Nothing of it in any graph (no saved tensor, no layer-end marker):
  // no backward can reach it.
  if (current_->refs == 0) DetachCurrent();
}

StatusOr<TrainingLoop::Pushed> LoopPool::Push(const Tensor& tensor) {
  TrainingLoop::Pushed pushed;
  if (current_ == nullptr || current_->state != LoopState::kForward ||
      current_->forward_count == 0) {
    return pushed;  // no layer open: stays on device
  }
  OFFLOAD_ASSIGN_OR_RETURN(SavedTensor saved,
                           OffloaderOf(*current_).Push(tensor));
  // A byte budget sees every pop of the tensors it was shown (its recording
  // counts them, its plan is indexed by them, and a pass reaching only kept
  // tensors must end its iteration); the other schedules hand kept tensors
  // back as they are.
  if (!saved.in_group() && !saved.is_composite() &&
      !options_.activation_budget_bytes.has_value()) {
    return pushed;
  }
  ++current_->handles;
  current_->had_handles = true;
  pushed.kept = false;
  pushed.saved = LoopSaved(IterationRef(current_), std::move(saved));
  return pushed;
}

Status LoopPool::BackwardStep(LoopIteration& iteration, int layer) {
  if (iteration.state == LoopState::kDone) return OkStatus();
  if (current_.get() == &iteration) {
    iteration.forward_ended = true;
    current_.reset();  // the caller's reference holds it
  }
  if (layer >= 0 && layer < static_cast<int>(iteration.stepped.size()) &&
      iteration.stepped[layer]) {
    return OkStatus();
  }
  if (iteration.state != LoopState::kInPass) {
    iteration.state = LoopState::kInPass;
    pass_.push_back(iteration.shared_from_this());
  }
  OFFLOAD_RETURN_IF_ERROR(OffloaderOf(iteration).BackwardStep(layer));
  iteration.stepped[layer] = true;
  return OkStatus();
}

StatusOr<Tensor> LoopPool::Pop(const LoopSaved& saved, int begin_layer) {
  if (saved.iteration().empty()) {
    return InvalidArgumentError("Pop: an empty handle (not from Push)");
  }
  LoopIteration& iteration = *saved.iteration().iteration_;
  if (iteration.state == LoopState::kDone) {
    return FailedPreconditionError(
        "Pop of a tensor saved in iteration " + std::to_string(iteration.id) +
        ": that iteration already ended (" + iteration.done_reason + ")");
  }
  if (begin_layer >= 0) {
    OFFLOAD_RETURN_IF_ERROR(BackwardStep(iteration, begin_layer));
  }
  return OffloaderOf(iteration).Pop(saved.saved());
}

Status LoopPool::PassEnded() {
  std::vector<std::shared_ptr<LoopIteration>> reached = std::move(pass_);
  pass_.clear();
  Status first = OkStatus();
  for (const std::shared_ptr<LoopIteration>& iteration : reached) {
    if (iteration->state != LoopState::kInPass) continue;
    std::fill(iteration->stepped.begin(), iteration->stepped.end(), false);
    if (iteration->handles == 0 || iteration->refs == 0) {
      first.Update(End(*iteration, /*abandon=*/false,
                       "its backward pass ended and freed its graph"));
      continue;
    }
    if (!options_.keep_host_copies) {
      first.Update(End(*iteration, /*abandon=*/false,
                       "its backward pass ended, and without keep_host_copies "
                       "a graph cannot be traversed twice (retain_graph)"));
      continue;
    }
    first.Update(OffloaderOf(*iteration).EndTraversal());
    iteration->state = LoopState::kRetained;
  }
  return first;
}

Status LoopPool::End(LoopIteration& iteration, bool abandon,
                     std::string reason) {
  if (iteration.state == LoopState::kDone) return OkStatus();
  Offloader& offloader = OffloaderOf(iteration);
  Status status = abandon ? offloader.AbandonIteration()
                          : offloader.FinishBackward();
  if (!abandon && status.code() == StatusCode::kFailedPrecondition) {
    diagnostics_.Warn("iteration " + std::to_string(iteration.id) +
                      ": FinishBackward refused (" + status.ToString() +
                      "); abandoned instead");
    status = offloader.AbandonIteration();
  }
  iteration.state = LoopState::kDone;
  iteration.done_reason = std::move(reason);
  live_.erase(std::remove(live_.begin(), live_.end(), &iteration),
              live_.end());
  idle_.push_back(iteration.offloader);
  return status;
}

void LoopPool::OnUnreferenced(LoopIteration& iteration) {
  if (current_.get() == &iteration) {
    // In the middle of its forward the next ForwardStep decides; once it
    // ran all its layers or EndForward ended it, no forward runs and
    // nothing can hold it again: abandoned now, as at the next forward.
    // (A caller holds the last layer's reference while that layer runs.)
    if (!iteration.forward_ended &&
        iteration.forward_count < options_.model_layers) {
      return;
    }
    DetachCurrent();
    return;
  }
  switch (iteration.state) {
    case LoopState::kForward:
      Note(End(iteration, /*abandon=*/true,
          "its forward's graph was freed without a backward"));
      break;
    case LoopState::kRetained:
      Note(End(iteration, /*abandon=*/false, "its graph was freed"));
      break;
    case LoopState::kInPass:  // the pass's end ends it
    case LoopState::kDone:
      break;
  }
}

void LoopPool::OnHandlesGone(LoopIteration& iteration) {
  if (current_.get() == &iteration) {
    if (iteration.state == LoopState::kForward) iteration.graph_dropped = true;
    return;
  }
  if (iteration.state == LoopState::kRetained) {
    Note(End(iteration, /*abandon=*/false,
        "the last of its saved tensors was freed"));
  }
}

void LoopPool::OnDestroyed(LoopIteration& iteration) {
  Note(End(iteration, /*abandon=*/true, "its graph was freed"));
}

void LoopPool::Close() { DetachCurrent(); }

int64_t LoopPool::OffloadedBytes() const {
  int64_t total = 0;
  for (const auto& offloader : offloaders_) total += offloader->OffloadedBytes();
  return total;
}

std::vector<std::string> LoopPool::Warnings() const {
  std::vector<std::string> all = diagnostics_.warnings();
  for (const auto& offloader : offloaders_) {
    const auto& more = offloader->diagnostics().warnings();
    all.insert(all.end(), more.begin(), more.end());
  }
  return all;
}

const Offloader* LoopPool::Current() const {
  if (current_ != nullptr) return offloaders_[current_->offloader].get();
  return last_offloader_ >= 0 ? offloaders_[last_offloader_].get() : nullptr;
}

// --- TrainingLoop -----------------------------------------------------------

StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(
    Backend& backend, const OffloadOptions& options) {
  // Checks the options once; the pool makes the same ones later.
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Offloader> probe,
                           Offloader::Create(backend, options));
  probe.reset();
  return std::unique_ptr<TrainingLoop>(
      new TrainingLoop(std::make_shared<LoopPool>(backend, options)));
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
