// PipelinePolicy: Megatron's fine-grained policy (engine/
// pipeline_offload.h) on the shared mechanism of engine/core. Which group
// moves when: groups offload at commit, reload one group ahead in backward
// order (SPEC §5.3), and after warm-up follow the frozen plan (§5.4). Each
// method has the contract of the PipelineOffloader method of the same
// name; the front door only checks its options and forwards. Private to
// the engine.

#ifndef OFFLOAD_ENGINE_PIPELINE_PIPELINE_POLICY_H_
#define OFFLOAD_ENGINE_PIPELINE_PIPELINE_POLICY_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/core/handle_maker.h"
#include "engine/core/offload_core.h"
#include "engine/core/offload_group.h"
#include "engine/offload_stats.h"
#include "engine/pipeline/chunk_order.h"
#include "engine/pipeline/freeze_plan.h"
#include "engine/pipeline_options.h"
#include "engine/pipeline_summary.h"
#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// Who issues the delayed offloads (delay_offload, §5.7).
enum class DelayedIssue {
  kExplicit,  // the caller's IssueDelayedOffloads
  // StartChunkBackward or FinishIteration, issuing what is still queued
  // (with a warning naming it).
  kLeftOver,
};

class PipelinePolicy {
 public:
  PipelinePolicy(Backend& backend, const PipelineOffloadOptions& options,
                 Stream& d2h, Stream& h2d);

  Status StartChunk(int stage, int microbatch);
  Status GroupStart(std::string_view name);
  StatusOr<SavedTensor> Push(const Tensor& tensor);
  StatusOr<SavedTensor> Push(const CompositeTensor& tensor);
  Status GroupCommit(std::string_view name,
                     const std::vector<Tensor>& release_tensors);
  // Issues the queued offloads; `caller` names the call in messages.
  // kFailedPrecondition while the compute stream captures (nothing
  // changes): for kExplicit always, for kLeftOver when something is queued.
  Status IssueDelayedOffloads(DelayedIssue issue, const std::string& caller);
  Status StartChunkBackward(int stage, int microbatch);
  Status GroupBackwardStart(std::string_view name);
  StatusOr<Tensor> Pop(const SavedTensor& saved);
  StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved);
  Status GroupBackwardEnd(std::string_view name);
  Status FinishIteration();
  Status AbandonIteration();

  bool warmed_up() const { return warmed_up_; }
  const std::optional<OffloadSummary>& summary() const { return summary_; }
  GroupDecision Decision(int chunk, int index) const;
  GroupState state(int stage, int microbatch, std::string_view name,
                   int ordinal) const;
  int64_t OffloadedBytes() const;
  OffloadCore& core() { return core_; }
  const OffloadCore& core() const { return core_; }

 private:
  // One group of an iteration: the n-th GroupStart of every iteration is
  // the same slot (the workload may not change after warm-up).
  struct Slot {
    std::unique_ptr<OffloadGroup> group;  // kept across iterations
    int chunk = -1;                       // index in chunks_
    std::string name;
    int ordinal = 0;        // among the chunk's groups of this name
    bool eligible = false;  // its name is offloaded
    GroupDecision decision = GroupDecision::kOffload;  // frozen
    // This iteration:
    bool offload = false;  // its tensors go to the group
    bool committed = false;
    bool backward_begun = false;
    bool backward_ended = false;
    // delay_offload: the ready point of the slot's pushes (those without
    // an event of their own), recorded on the compute stream when its
    // offload is issued, i.e. after the region's launch (§5.7). Kept
    // across iterations.
    std::shared_ptr<Event> issue_ready;
  };
  struct Chunk {
    ChunkId id;
    std::vector<int> slots;    // start order
    std::vector<int> commits;  // commit order
    std::vector<int> open;     // open groups, innermost last
    std::map<std::string, int, std::less<>> count;  // groups per name
    bool forward_ended = false;
    bool backward_begun = false;
    int backward_next = 0;     // groups whose backward began
    std::vector<int> running;  // backward begun, not ended
    bool prereloaded = false;  // §5.3: pre-reloaded once
    // max_inflight: offloads not yet waited for, per name, oldest first.
    std::map<std::string, std::deque<int>, std::less<>> inflight;
  };

  // Whether the compute stream is part of a graph capture now.
  bool Capturing() const {
    return core_.backend().IsCapturing(core_.compute());
  }
  std::string Iteration() const { return handles_.Iteration(); }
  std::string SlotName(int slot) const;
  // The chunk at the front of the backward order (next to run backward),
  // or -1.
  int FrontChunk() const;
  // OK if the chunk whose forward runs (if any) may end now: no group open
  // and, after the warm-up, as many groups as recorded. Errors:
  // kFailedPrecondition prefixed by `where`.
  Status CheckForwardChunkCanEnd(const std::string& where) const;
  // The chunk whose forward runs has finished (SPEC §5.3: another chunk
  // starts, forward or backward).
  void EndForwardChunk();
  // Frees device storages the caller dropped since their group's commit.
  Status FreeDropped();
  // Without delay_offload, kFailedPrecondition naming `call` and `slot`
  // while the compute stream captures (§5.7).
  Status CheckNotCapturing(int slot, const std::string& call) const;
  StatusOr<SavedTensor> PushOne(const Tensor& tensor, int slot);
  // A handle that keeps `tensor` as is; its storage is remembered for the
  // iteration (a forced release must not free it under the handle).
  SavedTensor KeptHandle(const Tensor& tensor, int slot);
  Status CheckHandle(const SavedTensor& saved, const char* call) const;
  StatusOr<Tensor> PopOne(const SavedTensor& saved);
  // Offloads `slot`'s group and releases its memory after the copies.
  Status Offload(int slot, const std::vector<Tensor>& release);
  // §5.6: waits for the oldest offloads of `slot`'s name beyond the cap.
  Status ApplyCap(int slot);
  // §5.3: after a group's backward, reloads the next offloaded group.
  Status ReloadAhead(int chunk);
  // The storages of `release` that `slot` may free (§5.1, §5.8h).
  std::vector<const Storage*> ForcedReleases(
      int slot, const std::vector<Tensor>& release);
  // Why `slot` may not free `storage` yet, for a message: an open or
  // delayed group has still to copy it, or another live handle of this
  // iteration reads it (a kept handle, another group's tensor on device, a
  // view of `slot` left on device); empty when nothing stops it.
  std::string OtherHolder(int slot, const Storage* storage) const;
  // Freezes the plan after warm-up.
  void Freeze();
  void EndIteration();
  // Releases every group and clears the iteration's state (FinishIteration
  // and AbandonIteration). Errors: the first failed ordering call.
  Status ResetIteration();

  const PipelineOffloadOptions options_;
  HandleMaker handles_{"PipelineOffloader"};
  OffloadCore core_;  // before slots_: groups use it until destroyed
  std::vector<Slot> slots_;
  std::vector<Chunk> chunks_;
  ChunkOrder order_;
  int next_slot_ = 0;
  int forward_chunk_ = -1;   // the chunk whose forward runs
  int backward_chunk_ = -1;  // the chunk whose backward runs
  int backward_chunks_ = 0;  // chunks whose backward began
  std::vector<int> pending_release_;  // slots holding caller storages
  // Storages of this iteration's kept handles (weak: the handles own them).
  std::vector<std::weak_ptr<Storage>> kept_storages_;
  // delay_offload: commits whose offload is not issued yet, in order.
  struct Delayed {
    int slot = -1;
    std::vector<Tensor> release;
  };
  std::vector<Delayed> delayed_;
  // Warm-up's record and the frozen plan.
  bool warmed_up_ = false;
  std::vector<RecordedChunk> recorded_;
  std::vector<int> recorded_groups_;  // groups per chunk
  std::vector<std::map<std::string, int, std::less<>>> recorded_count_;
  FrozenPlan plan_;
  std::optional<OffloadSummary> summary_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_PIPELINE_POLICY_H_
