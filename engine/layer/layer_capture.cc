// The layer policy under CUDA graph capture (SPEC §5.7): warm-up iterations
// that offload nothing but record the pinned memory each offload needs, and
// a capture of whole iterations that finds that memory pooled (a capture
// can neither allocate pinned memory nor wait on the host).

#include <string>
#include <utility>
#include <vector>

#include "engine/layer/layer_policy.h"

namespace offload {

std::string LayerPolicy::MidIteration() const {
  if (forward_count_ == 0 && backward_count_ == 0) return "";
  return "in the middle of " + Iteration() + " (" +
         std::to_string(forward_count_) + " forward and " +
         std::to_string(backward_count_) + " backward steps ran; " +
         "FinishBackward ends it)";
}

void LayerPolicy::RecordWarmupNeeds(int layer) {
  warmup_blocks_[layer] = Group(layer).PlannedHostBlocks();
}

void LayerPolicy::CheckCapturedOffload(int layer) {
  if (!capturing_) return;
  const OffloadGroup& group = Group(layer);
  if (group.state() != GroupState::kKeptOnDevice) return;
  capture_problems_.push_back(
      group.Where() + " stayed on device in the capture (its pinned buffers "
      "could not be taken: did its saved tensors change since the warm-up? "
      "see the warnings)");
}

Status LayerPolicy::BeginWarmup() {
  const std::string mid = MidIteration();
  if (!mid.empty()) return FailedPreconditionError("BeginWarmup " + mid);
  if (warmup_) return FailedPreconditionError("BeginWarmup: already warming up");
  if (capturing_) {
    return FailedPreconditionError(
        "BeginWarmup during a capture: warm-up iterations run eagerly, before "
        "BeginCapture");
  }
  warmup_ = true;
  warmup_blocks_.clear();
  return OkStatus();
}

Status LayerPolicy::EndWarmup() {
  const std::string mid = MidIteration();
  if (!mid.empty()) return FailedPreconditionError("EndWarmup " + mid);
  if (!warmup_) {
    return FailedPreconditionError("EndWarmup without BeginWarmup");
  }
  warmup_ = false;
  return OkStatus();
}

Status LayerPolicy::BeginCapture(CaptureMode mode) {
  Backend& backend = core_.backend();
  if (!backend.SupportsGraphs()) {
    return UnimplementedError(
        "Offloader::BeginCapture: the backend does not support graph capture");
  }
  const std::string mid = MidIteration();
  if (!mid.empty()) {
    return FailedPreconditionError("Offloader::BeginCapture " + mid +
                                   ": a capture holds whole iterations");
  }
  if (capturing_) {
    return FailedPreconditionError("Offloader::BeginCapture: already capturing");
  }
  if (warmup_) {
    return FailedPreconditionError(
        "Offloader::BeginCapture during warm-up: call EndWarmup first");
  }
  // The pinned blocks of every layer the captured step will offload.
  std::vector<std::pair<int64_t, int64_t>> blocks;
  if (options_.enabled) {
    for (int layer = 0; layer < options_.model_layers; ++layer) {
      auto it = warmup_blocks_.find(layer);
      if (it != warmup_blocks_.end()) {
        blocks.insert(blocks.end(), it->second.begin(), it->second.end());
      } else if (!options_.manual_synchronization && WillOffload(layer)) {
        return FailedPreconditionError(
            "Offloader::BeginCapture: layer " + std::to_string(layer) +
            " will be offloaded but no warm-up iteration recorded the pinned "
            "memory it needs (a capture cannot allocate pinned memory): run "
            "one iteration between BeginWarmup and EndWarmup first");
      }
    }
  }
  OFFLOAD_RETURN_IF_ERROR(
      core_.pinned().Reserve(blocks).WithContext("Offloader::BeginCapture"));
  OFFLOAD_RETURN_IF_ERROR(
      core_.pinned().Settle().WithContext("Offloader::BeginCapture"));
  OFFLOAD_RETURN_IF_ERROR(backend.BeginCapture(core_.compute(), mode)
                              .WithContext("Offloader::BeginCapture"));
  capturing_ = true;
  retain_pinned_ = true;  // the graph refers to the pooled buffers
  capture_problems_.clear();
  return OkStatus();
}

StatusOr<std::unique_ptr<Graph>> LayerPolicy::EndCapture() {
  if (!capturing_) {
    return FailedPreconditionError(
        "Offloader::EndCapture: no capture was begun by BeginCapture");
  }
  const std::string mid = MidIteration();
  if (!mid.empty()) {
    std::string moving;
    for (const auto& group : groups_) {
      if (group == nullptr) continue;
      const GroupState state = group->state();
      if (state == GroupState::kOffloadStarted ||
          state == GroupState::kOffloadFinished ||
          state == GroupState::kReloadStarted) {
        moving += (moving.empty() ? "" : ", ") + group->Where();
      }
    }
    return FailedPreconditionError(
        "Offloader::EndCapture " + mid + ": " +
        (moving.empty() ? std::string("a capture holds whole iterations")
                        : "the copies of " + moving +
                              " were started in this capture and would not "
                              "complete inside its graph") +
        "; the capture goes on");
  }
  StatusOr<std::unique_ptr<Graph>> graph =
      core_.backend().EndCapture(core_.compute());
  capturing_ = false;
  // What the capture recorded as the pooled buffers' last use never ran;
  // each launch runs whole on the compute stream, before any later copy.
  core_.pinned().ForgetReusePoints();
  if (!capture_problems_.empty()) {
    std::string problems;
    for (const std::string& problem : capture_problems_) {
      problems += (problems.empty() ? "" : "; ") + problem;
    }
    capture_problems_.clear();
    return FailedPreconditionError(
        "Offloader::EndCapture: the capture ended but its graph is dropped: " +
        problems);
  }
  if (!graph.ok()) {
    return graph.status().WithContext("Offloader::EndCapture");
  }
  return graph;
}

}  // namespace offload
