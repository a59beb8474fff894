// BudgetPolicy: the byte-budget schedule (SPEC §4.7) behind the
// layer-mode front door, on the shared mechanism of engine/core.
//
// A unit is one storage whose views are pushed by consecutive Push calls
// of a layer; each offloaded unit is a group of its own ("layer 3 unit 12"),
// so it moves alone. The first iteration (and the one after the workload
// changed) offloads nothing and records the units, their bytes and the
// calls that push and pop them; at its FinishBackward the plan is made
// (engine/plan/budget_plan.h). In the iterations after it:
//  - an offloaded unit's copy to host starts at its last push;
//  - at the end of the Push the plan names, the compute stream waits for
//    the copies of the units it releases and their memory is freed, so the
//    next saved tensor fits;
//  - at the start of the BackwardStep or Pop the plan names, a unit's
//    reload starts; a Pop of a unit whose reload has not started (the
//    workload changed) starts it there;
//  - once all of a unit's handles were popped and the caller dropped the
//    last popped view, its reloaded memory is freed, ordered after the
//    work enqueued by then (the reader): at that drop (each popped tensor
//    carries a notice, see PoppedView), or at the latest at the start of
//    the backward call the recording noted; FinishBackward frees what is
//    left;
//  - a reload starts at the plan's backward call, or earlier, in the
//    plan's order, as soon as it fits in the budget as things are (at a
//    call or at such a drop): the earliest point the budget has room.
// A push that does not match the recording (another layer, storage size or
// order) makes the policy warn, keep every later tensor of the iteration on
// device, and record the next iteration whose first unit is that one's
// again; so does a backward whose pops come where the plan frees (the free
// waits for the last pop).
// Workloads (one context around a GAN's two models in turn, batches of a
// few lengths): a plan is kept for each recorded workload, known by its
// first unit (layer, bytes, first push), up to kKeptWorkloads. At an
// iteration's first unit the policy follows the plan recorded with that
// first unit, else the one in force where the unit is no larger than its
// first (a shorter batch), else records this iteration (warned once per
// new workload), the plan in force kept for its own.
// Private to the engine.

#ifndef OFFLOAD_ENGINE_BUDGET_BUDGET_POLICY_H_
#define OFFLOAD_ENGINE_BUDGET_BUDGET_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/backend.h"
#include "engine/core/handle_maker.h"
#include "engine/core/offload_core.h"
#include "engine/core/offload_group.h"
#include "engine/device_bytes_probe.h"
#include "engine/offload_options.h"
#include "engine/plan/budget_plan.h"
#include "engine/plan/joint_plan.h"
#include "engine/policy/offloader_policy.h"
#include "engine/schedule.h"

namespace offload {

class BudgetPolicy final : public OffloaderPolicy {
 public:
  // REQUIRES: options.activation_budget_bytes > 0 (checked by Create);
  // `joint`, if any, is PlanJoint's plan for JointProblemOf(options)
  // (engine/plan/joint_problem_of.h).
  BudgetPolicy(Backend& backend, const OffloadOptions& options,
               std::optional<JointPlan> joint, Stream& d2h, Stream& h2d);
  ~BudgetPolicy() override;

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

  bool WillOffload(int layer) const override;
  // The state of the layer's first offloaded unit; not_offloaded if none.
  GroupState state(int layer) const override;
  int64_t OffloadedBytes() const override;
  const ScheduleTable& schedule() const override { return no_schedule_; }
  std::string BudgetPlanText() const override;
  bool Recompute(int layer) const override;
  std::string JointPlanText() const override;
  OffloadCore& core() override { return core_; }
  const OffloadCore& core() const override { return core_; }

 protected:
  std::string why_not_capturable() const override {
    return "the byte budget cannot be captured in a graph: it records its "
           "first iteration on the host and frees each unit when the host "
           "sees it dropped (use the default schedule, a schedule table or "
           "manual calls)";
  }

 private:
  // A unit of this iteration.
  struct Unit {
    int layer = 0;
    const Storage* storage = nullptr;
    int64_t bytes = 0;
    int first_push = 0;
    int last_push = 0;
    int first_use = -1;
    bool offloaded = false;  // handed to its group
    // Recording: the storage, to see when only the saved handles (one per
    // push) still hold it; the push at whose start that was first seen.
    std::weak_ptr<Storage> watch;
    int handles = 0;
    int dropped_at = -1;
    // Recording, backward: pops of its handles, and the backward calls at
    // whose start its memory was gone (free_at) or could go if offloaded
    // (done_at: all handles popped, the popped tensors dropped).
    int pops = 0;
    int free_at = -1;
    int done_at = -1;
  };

  // What a popped view's drop notice reaches: the policy, or nothing once
  // it is gone (views may outlive it).
  struct DropHub {
    BudgetPolicy* policy = nullptr;
  };
  // Marks the policy busy for the scope of a call: a notice that fires
  // meanwhile (the engine dropping a view itself) only counts the view.
  class Busy {
   public:
    explicit Busy(int& depth) : depth_(depth) { ++depth_; }
    ~Busy() { --depth_; }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    int& depth_;
  };

  std::string Iteration() const;
  // `tensor` popped from offloaded unit `unit`, with a storage handle that
  // tells the policy when the caller's last copy of it goes.
  Tensor PoppedView(Tensor tensor, int unit);
  // The notice: the view of `unit` popped in `iteration` was dropped. Frees
  // the unit if that was its last view and every handle was popped, then
  // starts the reloads that fit; failures are warned (the calls retry).
  void OnViewDropped(int unit, uint64_t iteration);
  // Offloadable bytes on device now: units not offloaded that someone still
  // holds, and offloaded units whose device memory is held (not yet
  // released in the forward, reloaded, or kept on device; or freed by the
  // plan while the caller still holds a popped view of it).
  int64_t ResidentNow() const;
  // Whether the plan freed an offloaded unit whose popped view the caller
  // still holds (its memory stays until the view is dropped).
  bool ViewsHeldPastFree() const;
  bool planned() const { return plan_.has_value() && !diverged_; }
  Status CheckPush(const std::string& what) const;
  // The unit `tensor` (pushed by push call `push`) belongs to: the last one
  // if it is the same storage pushed by this call or the previous one, else
  // a new one. Sets `*created`.
  int UnitOf(const Tensor& tensor, int push, bool* created);
  // Whether a new or grown unit matches the plan's recording; warns and
  // stops planning this iteration if not.
  void CheckAgainstPlan(int unit, bool created);
  StatusOr<SavedTensor> PushOne(const Tensor& tensor, int push);
  // The plan's work after push `push`: start the copies of units whose last
  // push it was, release those it names. A release that fails is warned
  // about and retried at the next call (the memory stays; nothing is lost).
  void AfterPush(int push);
  void RetryReleases();
  // Starts the offload of every unit still collecting pushes (a workload
  // whose units ended early).
  Status CloseUnits();
  // Starts reloads in the plan's order: each one the plan puts at or
  // before backward call `call` (`call` < 0: none; one that does not fit
  // beside memory popped views still hold after the plan freed it,
  // ViewsHeldPastFree, waits), and then each that fits in the budget now
  // (ResidentNow). Errors: a reload that failed (kept for a retry).
  Status RunReloads(int call);
  StatusOr<Tensor> PopOne(const SavedTensor& saved);
  // The errors a Pop of `saved` would return, found before the call runs
  // the plan's frees and reloads, so that a refused pop changes nothing:
  // the wrong kind of handle, a malformed one, a released unit, or one
  // whose handles were all popped and that this call's frees release.
  Status CheckPoppable(const SavedTensor& saved, bool composite) const;
  void NoteUse(const SavedTensor& saved);
  // Recording: notes the units the caller dropped by push `push`.
  void NoteDrops(int push);
  // Recording: notes, at the start of backward call `call`, the units whose
  // memory is gone or could go (Unit::free_at, done_at).
  void NoteBackwardDrops(int call);
  // Frees the offloaded units the plan frees at backward call `call`, and
  // those deferred, once every handle of theirs was popped.
  // Errors: an ordering call failed (the unit is released all the same; its
  // memory is kept, warned).
  Status RunFrees(int call);
  // A unit's memory after its backward: all of it, or with
  // keep_host_copies only the reloaded memory (SPEC §7.3).
  Status FreeUnit(int unit);
  // Whether the RunFrees of the call running now would release `unit`.
  bool FreedAtThisCall(int unit) const;
  OffloadGroup& Group(int unit);
  // After the recorded iteration: the recording and the plan.
  Status MakePlan();

  // A recorded workload's plan, kept while another's is in force.
  struct Workload {
    BudgetRecording recording;
    BudgetPlan plan;
    std::map<int, std::vector<int>> release_at_push, free_at_call;
    std::vector<int> reload_order;
  };
  // A workload's first unit: layer, bytes, first push.
  using FirstUnit = std::tuple<int, int64_t, int>;
  static FirstUnit FirstUnitOf(const BudgetRecording& recording);  // REQUIRES: a unit
  static FirstUnit FirstUnitOf(const Unit& unit);
  static constexpr size_t kKeptWorkloads = 8;
  // At the iteration's first unit (units_[0], made by push `push`): the
  // plan this iteration follows, or none (recorded), as the header says.
  // With a probe, a switch to recording comes only at push 0 (the probe's
  // figures start at the first push); else the plan in force is followed
  // and CheckAgainstPlan tells the divergence.
  void ChooseWorkload(int push);
  // The plan in force goes to kept_ (the oldest kept dropped beyond
  // kKeptWorkloads); none is in force after.
  void KeepWorkload();
  // kept_[i]'s plan in force; the one in force before, if any, kept.
  void TakeWorkload(size_t i);
  // The iteration diverged: its plan is kept, and the next iteration
  // with its first unit is recorded.
  void KeepDivergedWorkload();
  // Resets this iteration's state for the next one (FinishBackward,
  // AbandonIteration).
  void ResetIteration();
  // Counts a backward call of the layer whose backward runs (recorded for
  // BudgetRecording::held_outside).
  void CountBackwardCall();
  // Whether the recording has bytes held outside at a backward call in
  // [from, to): a reload may then not start earlier than the plan says.
  bool HeldOutsideIn(int from, int to) const;
  // Recording with a probe (OffloadOptions::device_bytes_probe, SPEC
  // §4.7): after push `push` registered its tensors, the most bytes in use
  // since the previous push (the first: since the first ForwardStep) that
  // the engine's saved tensors (ResidentNow) do not account for, above
  // those in use before the forward (the fewer of the bytes at the first
  // ForwardStep and at the first push, less `pushed_bytes`, the device
  // bytes of the first push's storages) (BudgetRecording::forward_outside).
  void ProbeAtPush(int push, int64_t pushed_bytes);
  // The same at the start of backward call `call` (backward_calls_ at
  // FinishBackward), after the call noted its drops: the interval since the
  // previous call (the first: since the last push, added to the last
  // push's), next to the fewer of the engine's bytes at its start and at
  // its end (held_outside).
  void ProbeAtCall(int call);

  const OffloadOptions options_;
  const int64_t budget_;
  const std::optional<JointPlan> joint_;  // SPEC §4.8
  HandleMaker handles_{"Offloader"};
  const ScheduleTable no_schedule_;
  OffloadCore core_;  // before groups_: they use it until destroyed
  std::vector<std::unique_ptr<OffloadGroup>> groups_;  // per unit index

  std::optional<BudgetRecording> recording_;
  std::optional<BudgetPlan> plan_;
  std::vector<Workload> kept_;            // other workloads' plans, oldest first
  std::vector<FirstUnit> record_next_;    // workloads to record when they come
  std::map<int, std::vector<int>> release_at_push_;  // from plan_
  std::map<int, std::vector<int>> free_at_call_;     // offloaded units
  std::vector<int> reload_order_;                     // by reload call
  // The smallest budget that fits, when the one asked for did not: told
  // once, by the FinishBackward that made the plan.
  std::optional<int64_t> refused_;
  DeviceBytesProbe* const probe_;  // options_.device_bytes_probe

  // Recording with a probe (ProbeAtPush, ProbeAtCall).
  std::optional<int64_t> probe_start_;  // in use at the first ForwardStep
  int64_t probe_base_ = 0;        // in use before the forward's tensors
  int64_t interval_engine_ = 0;   // the engine's bytes at the last sample
  std::vector<int64_t> forward_outside_;   // per push
  std::vector<int64_t> backward_outside_;  // per backward call

  // This iteration.
  bool diverged_ = false;
  int forward_count_ = 0;
  int open_layer_ = -1;
  int pushes_ = 0;          // Push calls so far
  int backward_calls_ = 0;  // BackwardStep and Pop calls since the backward began
  int backward_count_ = 0;
  int backward_layer_ = -1;       // the last BackwardStep's layer
  std::vector<int> call_layers_;  // per backward call: backward_layer_
  std::vector<bool> backward_begun_;
  std::vector<Unit> units_;
  size_t first_held_ = 0;  // recording: units before it were dropped
  std::vector<int> pending_releases_;
  std::vector<int> deferred_frees_;  // due, waiting for their last pop
  size_t next_reload_ = 0;
  std::vector<int> live_views_;  // per unit: popped views the caller holds
  int traversals_ = 0;           // backward passes ended by EndTraversal

  int busy_ = 0;  // > 0 inside a call (Busy)
  const std::shared_ptr<DropHub> hub_ = std::make_shared<DropHub>();
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_BUDGET_BUDGET_POLICY_H_
