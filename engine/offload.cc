// The layer front door: option checks and the public class, which forwards
// to its policy (engine/policy/offloader_policy.h): TE's schedules
// (engine/layer/layer_policy.h) or the byte budget (engine/budget/).

#include "engine/offload.h"

#include <optional>
#include <string>
#include <utility>

#include "engine/budget/budget_policy.h"
#include "engine/layer/layer_policy.h"
#include "engine/plan/joint_problem_of.h"
#include "engine/policy/offloader_policy.h"

namespace offload {

// ---------------------------------------------------------------------------
// The public class forwards to its policy.

Offloader::Offloader(std::unique_ptr<OffloaderPolicy> policy)
    : policy_(std::move(policy)) {}

// Groups go first (the policy's member order), each freeing its memory ordered
// after the copies that use it; then the core returns pooled and kept
// memory the same way.
Offloader::~Offloader() = default;

StatusOr<std::unique_ptr<Offloader>> Offloader::Create(
    Backend& backend, const OffloadOptions& options) {
  auto invalid = [](const std::string& why) {
    return InvalidArgumentError("Offloader options: " + why);
  };
  if (options.model_layers < 1) {
    return invalid("model_layers must be at least 1, got " +
                   std::to_string(options.model_layers));
  }
  if (options.model_layers > kMaxModelLayers) {
    return invalid("model_layers must be at most " +
                   std::to_string(kMaxModelLayers) + ", got " +
                   std::to_string(options.model_layers));
  }
  if (options.offload_stream != nullptr &&
      !backend.Owns(*options.offload_stream)) {
    return invalid("offload_stream belongs to another backend");
  }
  if (options.min_offload_elements < 0) {
    return invalid("min_offload_elements must not be negative");
  }
  if (!(options.min_span_coverage >= 0.0 && options.min_span_coverage <= 1.0)) {
    return invalid("min_span_coverage must be in [0, 1]");
  }
  if (options.offload_stream != nullptr && !options.manual_synchronization) {
    return invalid("a custom offload_stream needs manual_synchronization");
  }
  if (options.schedule.has_value() && options.manual_synchronization) {
    return invalid("a schedule table and manual_synchronization exclude each "
                   "other");
  }
  if (options.activation_budget_bytes.has_value()) {
    if (*options.activation_budget_bytes <= 0) {
      return invalid("activation_budget_bytes must be positive, got " +
                     std::to_string(*options.activation_budget_bytes));
    }
    if (options.manual_synchronization || options.schedule.has_value()) {
      return invalid("activation_budget_bytes excludes manual_synchronization "
                     "and a schedule table");
    }
  }
  if (options.device_bytes_probe != nullptr &&
      !options.activation_budget_bytes.has_value()) {
    return invalid("device_bytes_probe needs activation_budget_bytes");
  }
  std::optional<JointPlan> joint;
  if (options.recompute.has_value()) {
    const RecomputeOptions& rc = *options.recompute;
    if (!options.activation_budget_bytes.has_value()) {
      return invalid("recompute needs activation_budget_bytes");
    }
    if (static_cast<int>(rc.layers.size()) != options.model_layers) {
      return invalid("recompute declares " + std::to_string(rc.layers.size()) +
                     " layers, model_layers is " +
                     std::to_string(options.model_layers));
    }
    StatusOr<JointPlan> plan = PlanJoint(JointProblemOf(options));
    if (!plan.ok()) return plan.status().WithContext("Offloader options");
    if (options.enabled) joint = std::move(plan).value();
  }
  ScheduleTable schedule;
  bool warn_no_overlap = false;
  const bool budget = options.activation_budget_bytes.has_value();
  if (options.enabled && !options.manual_synchronization && !budget) {
    if (options.schedule.has_value()) {
      OFFLOAD_RETURN_IF_ERROR(
          ValidateSchedule(*options.schedule, options.model_layers)
              .WithContext("Offloader options"));
      schedule = *options.schedule;
    } else {
      StatusOr<ScheduleTable> table =
          DefaultSchedule(options.model_layers, options.offloaded_layers);
      if (!table.ok()) return table.status().WithContext("Offloader options");
      schedule = std::move(table).value();
      warn_no_overlap = options.offloaded_layers > 0 &&
                        options.offloaded_layers == options.model_layers - 1;
    }
  }
  // Disabled: no copy stream is made (the core is given the compute stream
  // and never copies).
  Stream* d2h = &backend.ComputeStream();
  Stream* h2d = d2h;
  if (options.enabled) {
    if (options.offload_stream != nullptr) {
      d2h = h2d = options.offload_stream;
    } else {
      OFFLOAD_ASSIGN_OR_RETURN(d2h, backend.NewStream("offload_d2h"));
      OFFLOAD_ASSIGN_OR_RETURN(h2d, backend.NewStream("offload_h2d"));
    }
  }
  std::unique_ptr<OffloaderPolicy> policy;
  if (budget) {
    policy = std::make_unique<BudgetPolicy>(backend, options, std::move(joint),
                                            *d2h, *h2d);
  } else {
    policy = std::make_unique<LayerPolicy>(backend, options,
                                           std::move(schedule), *d2h, *h2d);
  }
  if (warn_no_overlap) {
    policy->core().Warn(
        "offloading " + std::to_string(options.offloaded_layers) + " of " +
        std::to_string(options.model_layers) +
        " layers leaves one layer's activations on device: compute and "
        "copies cannot overlap; offload at most model_layers - 2 for overlap");
  }
  return std::unique_ptr<Offloader>(new Offloader(std::move(policy)));
}

StatusOr<int> Offloader::ForwardStep() { return policy_->ForwardStep(); }
Status Offloader::BackwardStep(int layer) {
  return policy_->BackwardStep(layer);
}
Status Offloader::FinishBackward() { return policy_->FinishBackward(); }
Status Offloader::AbandonIteration() { return policy_->AbandonIteration(); }
Status Offloader::EndTraversal() { return policy_->EndTraversal(); }
StatusOr<SavedTensor> Offloader::Push(const Tensor& tensor) {
  return policy_->Push(tensor);
}
StatusOr<SavedTensor> Offloader::Push(const CompositeTensor& tensor) {
  return policy_->Push(tensor);
}
StatusOr<Tensor> Offloader::Pop(const SavedTensor& saved) {
  return policy_->Pop(saved);
}
StatusOr<CompositeTensor> Offloader::PopComposite(const SavedTensor& saved) {
  return policy_->PopComposite(saved);
}
Status Offloader::StartOffload(int layer) {
  return policy_->Manual(ManualCall::kStartOffload, layer);
}
Status Offloader::ReleaseForwardMemory(int layer) {
  return policy_->Manual(ManualCall::kReleaseForwardMemory, layer);
}
Status Offloader::StartReload(int layer) {
  return policy_->Manual(ManualCall::kStartReload, layer);
}
int64_t Offloader::OffloadedBytes() const { return policy_->OffloadedBytes(); }
const Diagnostics& Offloader::diagnostics() const {
  return policy_->core().diagnostics();
}
GroupState Offloader::state(int layer) const { return policy_->state(layer); }
const OffloaderStats& Offloader::stats() const {
  return policy_->core().stats();
}
const ScheduleTable& Offloader::schedule() const { return policy_->schedule(); }
bool Offloader::WillOffload(int layer) const {
  return policy_->WillOffload(layer);
}
std::string Offloader::BudgetPlanText() const {
  return policy_->BudgetPlanText();
}
bool Offloader::Recompute(int layer) const {
  return policy_->Recompute(layer);
}
std::string Offloader::JointPlanText() const {
  return policy_->JointPlanText();
}

Status Offloader::BeginWarmup() { return policy_->BeginWarmup(); }
Status Offloader::EndWarmup() { return policy_->EndWarmup(); }
Status Offloader::BeginCapture(CaptureMode mode) {
  return policy_->BeginCapture(mode);
}
StatusOr<std::unique_ptr<Graph>> Offloader::EndCapture() {
  return policy_->EndCapture();
}
bool Offloader::warming_up() const { return policy_->warming_up(); }
bool Offloader::capturing() const { return policy_->capturing(); }

}  // namespace offload
