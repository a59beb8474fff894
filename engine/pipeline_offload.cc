// The fine-grained front door: option checks and the public class, which
// forwards to its policy (engine/pipeline/pipeline_policy.h).

#include "engine/pipeline_offload.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "engine/pipeline/pipeline_policy.h"

namespace offload {

PipelineOffloader::PipelineOffloader(std::unique_ptr<PipelinePolicy> policy)
    : policy_(std::move(policy)) {}

PipelineOffloader::~PipelineOffloader() = default;

StatusOr<std::unique_ptr<PipelineOffloader>> PipelineOffloader::Create(
    Backend& backend, const PipelineOffloadOptions& options) {
  auto invalid = [](const std::string& why) {
    return InvalidArgumentError("PipelineOffloader options: " + why);
  };
  const double f = options.activation_offload_fraction;
  if (!(f >= 0.0 && f <= 1.0)) {
    return invalid("activation_offload_fraction must be in [0, 1], got " +
                   std::to_string(f));
  }
  if (options.min_offload_elements < 0) {
    return invalid("min_offload_elements must not be negative");
  }
  if (options.delta_offload_bytes < 0) {
    return invalid("delta_offload_bytes must not be negative");
  }
  if (options.pipeline_rank < 0) {
    return invalid("pipeline_rank must not be negative, got " +
                   std::to_string(options.pipeline_rank));
  }
  if (options.pipeline_rank > 0 &&
      options.delta_offload_bytes >
          std::numeric_limits<int64_t>::max() / options.pipeline_rank) {
    return invalid("pipeline_rank (" + std::to_string(options.pipeline_rank) +
                   ") x delta_offload_bytes (" +
                   std::to_string(options.delta_offload_bytes) +
                   ") does not fit in int64");
  }
  if (options.virtual_stages < 1 || options.virtual_stages > 1024) {
    return invalid("virtual_stages must be in [1, 1024], got " +
                   std::to_string(options.virtual_stages));
  }
  std::set<std::string> modules;
  for (const std::string& name : options.offload_modules) {
    if (name.empty()) return invalid("an empty name in offload_modules");
    if (!modules.insert(name).second) {
      return invalid("'" + name + "' appears twice in offload_modules");
    }
  }
  for (const auto& [name, cap] : options.max_inflight) {
    if (cap < 0) {
      return invalid("max_inflight of '" + name + "' must not be negative, "
                     "got " + std::to_string(cap));
    }
  }
  if (!(options.min_span_coverage >= 0.0 && options.min_span_coverage <= 1.0)) {
    return invalid("min_span_coverage must be in [0, 1]");
  }
  Stream* d2h = &backend.ComputeStream();
  Stream* h2d = d2h;
  if (options.enabled) {
    OFFLOAD_ASSIGN_OR_RETURN(d2h, backend.NewStream("offload_d2h"));
    OFFLOAD_ASSIGN_OR_RETURN(h2d, backend.NewStream("offload_h2d"));
  }
  auto policy = std::make_unique<PipelinePolicy>(backend, options, *d2h, *h2d);
  for (const auto& [name, cap] : options.max_inflight) {
    if (!modules.count(name)) {
      policy->core().Warn("max_inflight names '" + name + "', which is not in "
                        "offload_modules: it has no effect");
    }
  }
  return std::unique_ptr<PipelineOffloader>(
      new PipelineOffloader(std::move(policy)));
}

Status PipelineOffloader::StartChunk(int stage, int microbatch) {
  return policy_->StartChunk(stage, microbatch);
}
Status PipelineOffloader::GroupStart(std::string_view name) {
  return policy_->GroupStart(name);
}
StatusOr<SavedTensor> PipelineOffloader::Push(const Tensor& tensor) {
  return policy_->Push(tensor);
}
StatusOr<SavedTensor> PipelineOffloader::Push(const CompositeTensor& tensor) {
  return policy_->Push(tensor);
}
Status PipelineOffloader::GroupCommit(
    std::string_view name, const std::vector<Tensor>& release_tensors) {
  return policy_->GroupCommit(name, release_tensors);
}
Status PipelineOffloader::IssueDelayedOffloads() {
  return policy_->IssueDelayedOffloads(DelayedIssue::kExplicit,
                                       "IssueDelayedOffloads");
}
Status PipelineOffloader::StartChunkBackward(int stage, int microbatch) {
  return policy_->StartChunkBackward(stage, microbatch);
}
Status PipelineOffloader::GroupBackwardStart(std::string_view name) {
  return policy_->GroupBackwardStart(name);
}
StatusOr<Tensor> PipelineOffloader::Pop(const SavedTensor& saved) {
  return policy_->Pop(saved);
}
StatusOr<CompositeTensor> PipelineOffloader::PopComposite(
    const SavedTensor& saved) {
  return policy_->PopComposite(saved);
}
Status PipelineOffloader::GroupBackwardEnd(std::string_view name) {
  return policy_->GroupBackwardEnd(name);
}
Status PipelineOffloader::FinishIteration() {
  return policy_->FinishIteration();
}

Status PipelineOffloader::AbandonIteration() {
  return policy_->AbandonIteration();
}
bool PipelineOffloader::warmed_up() const { return policy_->warmed_up(); }
const std::optional<OffloadSummary>& PipelineOffloader::summary() const {
  return policy_->summary();
}
GroupDecision PipelineOffloader::Decision(int chunk, int index) const {
  return policy_->Decision(chunk, index);
}
GroupState PipelineOffloader::state(int stage, int microbatch,
                                    std::string_view name, int ordinal) const {
  return policy_->state(stage, microbatch, name, ordinal);
}
int64_t PipelineOffloader::OffloadedBytes() const {
  return policy_->OffloadedBytes();
}
const Diagnostics& PipelineOffloader::diagnostics() const {
  return policy_->core().diagnostics();
}
const OffloaderStats& PipelineOffloader::stats() const {
  return policy_->core().stats();
}

}  // namespace offload
