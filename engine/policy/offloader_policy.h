// OffloaderPolicy: what the layer-mode front door (engine/offload.h) asks of
// a policy. Two policies implement it on the shared mechanism of
// engine/core: TE's schedule of whole layers (LayerPolicy,
// engine/layer/layer_policy.h: default k-of-n, a schedule table, manual
// calls) and the byte budget of SPEC §4.7 (BudgetPolicy,
// engine/budget/budget_policy.h). Each method has the contract of the
// Offloader method of the same name; the Offloader only checks its options
// and forwards. Private to the engine.

#ifndef OFFLOAD_ENGINE_POLICY_OFFLOADER_POLICY_H_
#define OFFLOAD_ENGINE_POLICY_OFFLOADER_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/core/offload_core.h"
#include "engine/offload_options.h"
#include "engine/saved_tensor.h"
#include "engine/schedule.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// The manual-synchronization calls (SPEC §4.3), one method of the policy.
enum class ManualCall { kStartOffload, kReleaseForwardMemory, kStartReload };

// "StartOffload", "ReleaseForwardMemory", "StartReload".
const char* ManualCallName(ManualCall call);

class OffloaderPolicy {
 public:
  virtual ~OffloaderPolicy() = default;

  virtual StatusOr<int> ForwardStep() = 0;
  virtual Status BackwardStep(int layer) = 0;
  virtual Status FinishBackward() = 0;
  virtual Status AbandonIteration() = 0;
  virtual Status EndTraversal() = 0;
  virtual StatusOr<SavedTensor> Push(const Tensor& tensor) = 0;
  virtual StatusOr<SavedTensor> Push(const CompositeTensor& tensor) = 0;
  virtual StatusOr<Tensor> Pop(const SavedTensor& saved) = 0;
  virtual StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved) = 0;
  // Offloader::StartOffload, ReleaseForwardMemory or StartReload.
  virtual Status Manual(ManualCall call, int layer) = 0;

  virtual bool WillOffload(int layer) const = 0;
  virtual GroupState state(int layer) const = 0;
  virtual int64_t OffloadedBytes() const = 0;
  virtual const ScheduleTable& schedule() const = 0;
  virtual std::string BudgetPlanText() const { return ""; }
  virtual bool Recompute(int /*layer*/) const { return false; }
  virtual std::string JointPlanText() const { return ""; }
  // Graph capture (SPEC §5.7). A policy that cannot be captured refuses
  // each with kFailedPrecondition naming `why_not_capturable()`.
  virtual Status BeginWarmup() { return NotCapturable("BeginWarmup"); }
  virtual Status EndWarmup() { return NotCapturable("EndWarmup"); }
  virtual Status BeginCapture(CaptureMode /*mode*/) {
    return NotCapturable("BeginCapture");
  }
  virtual StatusOr<std::unique_ptr<Graph>> EndCapture() {
    return NotCapturable("EndCapture");
  }
  virtual bool warming_up() const { return false; }
  virtual bool capturing() const { return false; }
  virtual OffloadCore& core() = 0;
  virtual const OffloadCore& core() const = 0;

 protected:
  // Why this policy cannot be captured (used only by the defaults above).
  virtual std::string why_not_capturable() const {
    return "this policy does not support graph capture";
  }

 private:
  Status NotCapturable(const char* call) const {
    return FailedPreconditionError(std::string("Offloader::") + call + ": " +
                                   why_not_capturable());
  }
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_POLICY_OFFLOADER_POLICY_H_
