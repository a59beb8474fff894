// LayerPolicy: TE's policy of when whole layers move (engine/offload.h) on
// the shared mechanism of engine/core: default k-of-n, a schedule table, or
// manual calls; and the graph capture of its iterations (layer_capture.cc).
// Private to the engine.

#ifndef OFFLOAD_ENGINE_LAYER_LAYER_POLICY_H_
#define OFFLOAD_ENGINE_LAYER_LAYER_POLICY_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/core/handle_maker.h"
#include "engine/core/offload_core.h"
#include "engine/core/offload_group.h"
#include "engine/core/push_checks.h"
#include "engine/offload_options.h"
#include "engine/policy/layer_steps.h"
#include "engine/policy/offloader_policy.h"
#include "engine/schedule.h"

namespace offload {

class LayerPolicy final : public OffloaderPolicy {
 public:
  LayerPolicy(Backend& backend, const OffloadOptions& options,
              ScheduleTable schedule, Stream& d2h, Stream& h2d)
      : options_(options),
        schedule_(std::move(schedule)),
        core_(backend, d2h, h2d,
              CoreOptions{options.min_span_coverage, options.skip_sparse_views,
                          options.warnings_to_stderr}),
        retain_pinned_(options.retain_pinned_buffers) {
    const int n = options_.model_layers;
    // Groups are made when a layer first pushes into one (a disabled or
    // mostly kept-on-device stack costs nothing per layer).
    groups_.resize(options_.enabled ? n : 0);
    backward_begun_.assign(options_.enabled ? n : 0, false);
    for (const auto& [layer, entry] : schedule_) {
      release_at_[ScheduleStep(n, entry.offload_fwd, entry.offload_num)]
          .push_back(layer);
      reload_at_[ScheduleStep(n, entry.reload_fwd, entry.reload_num)]
          .push_back(layer);
    }
  }

  StatusOr<int> ForwardStep() override;
  Status BackwardStep(int layer) override;
  Status FinishBackward() override;
  Status AbandonIteration() override;
  Status EndTraversal() override;
  StatusOr<SavedTensor> Push(const Tensor& tensor) override;
  StatusOr<SavedTensor> Push(const CompositeTensor& tensor) override;
  StatusOr<Tensor> Pop(const SavedTensor& saved) override;
  StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved) override;
  Status Manual(ManualCall call, int layer) override;

  bool WillOffload(int layer) const override {
    if (!options_.enabled || layer < 0 || layer >= options_.model_layers) {
      return false;
    }
    return options_.manual_synchronization || schedule_.count(layer) > 0;
  }
  GroupState state(int layer) const override {
    if (layer < 0 || layer >= options_.model_layers) {
      return GroupState::kNotOffloaded;
    }
    const OffloadGroup* group = FindGroup(layer);
    return group != nullptr ? group->state() : GroupState::kNotOffloaded;
  }
  int64_t OffloadedBytes() const override {
    int64_t total = core_.pinned().bytes();
    for (const auto& group : groups_) {
      if (group != nullptr) total += group->host_bytes();
    }
    return total;
  }
  const ScheduleTable& schedule() const override { return schedule_; }
  OffloadCore& core() override { return core_; }
  const OffloadCore& core() const override { return core_; }

  // Graph capture (engine/layer_capture.cc).
  Status BeginWarmup() override;
  Status EndWarmup() override;
  Status BeginCapture(CaptureMode mode) override;
  StatusOr<std::unique_ptr<Graph>> EndCapture() override;
  bool warming_up() const override { return warmup_; }
  bool capturing() const override { return capturing_; }

 private:
  // The name of the call and "in the middle of iteration N" when a step of
  // the iteration has run; empty between iterations.
  std::string MidIteration() const;
  // Warm-up: records the pinned blocks `layer`'s offload would take.
  void RecordWarmupNeeds(int layer);
  // During a capture: `layer`'s StartOffload just ran; a layer that stayed
  // on device is a capture problem (EndCapture fails).
  void CheckCapturedOffload(int layer);
  std::string Iteration() const { return handles_.Iteration(); }
  Status CloseForward();
  // Releases every group and readies the next iteration (FinishBackward,
  // AbandonIteration). Errors: the first failed ordering call.
  Status EndThisIteration();
  Status RunStep(int step);
  Status CheckPush(const std::string& what) const;
  Status CheckHandle(const SavedTensor& saved, const char* call) const;
  StatusOr<SavedTensor> PushOne(const Tensor& tensor, int layer);
  StatusOr<Tensor> PopOne(const SavedTensor& saved);
  const OffloadGroup* FindGroup(int layer) const {
    if (layer < 0 || layer >= static_cast<int>(groups_.size())) return nullptr;
    return groups_[layer].get();
  }
  // The layer's group, made on first use. REQUIRES: 0 <= layer < n, enabled.
  OffloadGroup& Group(int layer) {
    std::unique_ptr<OffloadGroup>& group = groups_[layer];
    if (group == nullptr) {
      group = std::make_unique<OffloadGroup>(core_, LayerName(layer),
                                             /*pinned_tag=*/layer);
    }
    return *group;
  }
  // Checks a tensor Push would hand to a group: well-formed, and its memory
  // and ready event belong to this backend (a foreign storage would be read
  // through another backend's address space: silent corruption).
  Status CheckOffloadable(const Tensor& tensor, const WhereFn& where) const;

  const OffloadOptions options_;
  const ScheduleTable schedule_;
  HandleMaker handles_{"Offloader"};
  OffloadCore core_;  // before groups_: they use it until destroyed
  std::vector<std::unique_ptr<OffloadGroup>> groups_;
  // The policy: which layers are released / start reloading at each step
  // (schedule.h: forward of the c-th layer is step c, backward n + c).
  std::map<int, std::vector<int>> release_at_;
  std::map<int, std::vector<int>> reload_at_;

  int forward_count_ = 0;   // layers whose forward began this iteration
  int backward_count_ = 0;  // layers whose backward began this iteration
  int open_layer_ = -1;     // the layer whose pushes are being collected
  int last_backward_ = -1;  // released when the next backward step begins
  std::vector<bool> backward_begun_;
  int traversals_ = 0;      // backward passes ended by EndTraversal

  // Pinned buffers are pooled per layer (retain_pinned_buffers, or after a
  // capture, whose graph refers to them).
  bool retain_pinned_;
  bool warmup_ = false;
  bool capturing_ = false;
  // The pinned blocks (bytes, pool tag) of each layer the last warm-up
  // would have offloaded.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> warmup_blocks_;
  std::vector<std::string> capture_problems_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_LAYER_LAYER_POLICY_H_
