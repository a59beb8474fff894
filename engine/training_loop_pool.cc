// The training loop's pool of Offloaders (training_loop.h,
// training_loop_internal.h): beginning and ending iterations, the calls
// TrainingLoop forwards, and what happens when an iteration's graph lets go
// of it.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/training_loop.h"
#include "engine/training_loop_internal.h"

namespace offload {

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
    case LoopState::kInPass:
      // The pass's end ends it, unless no backward runs: then that pass
      // raised, and nothing of this graph can be reached again.
      if (backward_running_ && !backward_running_()) {
        Note(End(iteration, /*abandon=*/false,
                 "its backward pass raised and its graph was freed"));
      }
      break;
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

}  // namespace offload
