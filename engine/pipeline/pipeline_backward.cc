// The fine-grained policy, backward side: chunks in backward order, groups
// in reverse commit order, reload one group ahead (SPEC §5.2, §5.3), and
// the warm-up's freeze (§5.4).

#include <algorithm>
#include <string>
#include <utility>

#include "engine/core/push_checks.h"
#include "engine/pipeline/pipeline_policy.h"

namespace offload {

Status PipelinePolicy::StartChunkBackward(int stage, int microbatch) {
  if (!options_.enabled) return OkStatus();
  const ChunkId id{stage, microbatch};
  const std::string where =
      "StartChunkBackward(" + id.ToString() + ") in " + Iteration();
  auto it = std::find_if(chunks_.begin(), chunks_.end(),
                         [&](const Chunk& c) { return c.id == id; });
  if (it == chunks_.end()) {
    return FailedPreconditionError(where + ": its forward has not run");
  }
  const int index = static_cast<int>(it - chunks_.begin());
  const int front = FrontChunk();
  if (index != front) {
    return FailedPreconditionError(
        where + ": the next chunk in backward order (SPEC §5.2) is " +
        (front >= 0 ? chunks_[front].id.ToString()
                    : std::string("not known yet (its forward has not run)")));
  }
  if (!it->open.empty()) {
    return FailedPreconditionError(where + ": " + SlotName(it->open.back()) +
                                   " is still open");
  }
  // The chunk whose forward ran last (this one, or another in 1F1B: F0 F1
  // B0) ends now; every earlier one was checked when it ended.
  OFFLOAD_RETURN_IF_ERROR(CheckForwardChunkCanEnd(where));
  if (backward_chunk_ >= 0) {
    const Chunk& previous = chunks_[backward_chunk_];
    if (previous.backward_next < static_cast<int>(previous.commits.size()) ||
        !previous.running.empty()) {
      return FailedPreconditionError(
          where + ": the backward of " + previous.id.ToString() +
          " has groups that did not end");
    }
  }
  // Delayed offloads are issued before any backward (never dropped). If
  // that fails they are issued all the same, and the backward has not
  // begun: a retry goes on.
  OFFLOAD_RETURN_IF_ERROR(IssueDelayedOffloads(DelayedIssue::kLeftOver, where));
  // SPEC §5.3: a rank runs one chunk at a time, so whichever chunk's
  // forward ran last has finished (and may be pre-reloaded).
  EndForwardChunk();
  it->forward_ended = true;
  it->backward_begun = true;
  backward_chunk_ = index;
  ++backward_chunks_;
  return OkStatus();
}

Status PipelinePolicy::GroupBackwardStart(std::string_view name) {
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "GroupBackwardStart('" + std::string(name) + "') in " + Iteration();
  if (backward_chunk_ < 0) {
    return FailedPreconditionError(where + ": no chunk's backward is running "
                                   "(StartChunkBackward first)");
  }
  Chunk& chunk = chunks_[backward_chunk_];
  const int done = chunk.backward_next;
  if (done >= static_cast<int>(chunk.commits.size())) {
    return FailedPreconditionError(where + ": every group of " +
                                   chunk.id.ToString() +
                                   " already began its backward");
  }
  const int slot = chunk.commits[chunk.commits.size() - 1 - done];
  if (slots_[slot].name != name) {
    return FailedPreconditionError(
        where + ": the next group in reverse commit order is " +
        SlotName(slot));
  }
  // Nobody reloaded it ahead: reload now (ordered after its own copies).
  OffloadGroup& group = *slots_[slot].group;
  if (group.state() == GroupState::kOffloadFinished) {
    OFFLOAD_RETURN_IF_ERROR(group.StartReload().WithContext(where));
  }
  ++chunk.backward_next;
  chunk.running.push_back(slot);
  slots_[slot].backward_begun = true;
  return OkStatus();
}

Status PipelinePolicy::CheckHandle(const SavedTensor& saved,
                                            const char* call) const {
  return handles_.Check(saved, options_.enabled, call);
}

StatusOr<Tensor> PipelinePolicy::PopOne(const SavedTensor& saved) {
  if (const SavedTensor::Kept* kept = saved.kept()) return kept->tensor;
  const SavedTensor::InGroup* entry = saved.group_entry();
  if (entry == nullptr || entry->group < 0 || entry->group >= next_slot_) {
    return InvalidArgumentError("Pop: a malformed SavedTensor (no group " +
                                std::string(entry ? std::to_string(entry->group)
                                                  : "entry") + ")");
  }
  OffloadGroup& group = *slots_[entry->group].group;
  // SPEC §5.8b: a pop before any reload reloads the whole group, ordered
  // after the group's copies to host — never a read of a half-written
  // buffer.
  if (group.state() == GroupState::kOffloadFinished) {
    OFFLOAD_RETURN_IF_ERROR(group.StartReload().WithContext(
        "Pop in " + SlotName(entry->group)));
  }
  return group.Pop(entry->index);
}

StatusOr<Tensor> PipelinePolicy::Pop(const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "Pop"));
  return PopPlain(saved, [this](const SavedTensor& s) { return PopOne(s); });
}

StatusOr<CompositeTensor> PipelinePolicy::PopComposite(
    const SavedTensor& saved) {
  OFFLOAD_RETURN_IF_ERROR(CheckHandle(saved, "PopComposite"));
  return offload::PopComposite(
      saved, [this](const SavedTensor& s) { return PopOne(s); });
}

Status PipelinePolicy::GroupBackwardEnd(std::string_view name) {
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "GroupBackwardEnd('" + std::string(name) + "') in " + Iteration();
  if (backward_chunk_ < 0) {
    return FailedPreconditionError(where + ": no chunk's backward is running");
  }
  Chunk& chunk = chunks_[backward_chunk_];
  auto running = std::find_if(chunk.running.rbegin(), chunk.running.rend(),
                              [&](int s) { return slots_[s].name == name; });
  if (running == chunk.running.rend()) {
    return FailedPreconditionError(where + " in " + chunk.id.ToString() +
                                   ": no group of that name is in its "
                                   "backward");
  }
  const int slot = *running;
  chunk.running.erase(std::next(running).base());
  Slot& s = slots_[slot];
  s.backward_ended = true;
  if (!warmed_up_) {
    auto commit = std::find(chunk.commits.begin(), chunk.commits.end(), slot);
    RecordedGroup& record =
        recorded_[backward_chunk_].groups[commit - chunk.commits.begin()];
    const GroupState state = s.group->state();
    record.offloaded = state == GroupState::kOffloadStarted ||
                       state == GroupState::kOffloadFinished ||
                       state == GroupState::kReloadStarted;
    record.bytes = s.group->copied_bytes();
    record.caller_held_bytes = s.group->caller_held_bytes();
  }
  pending_release_.erase(
      std::remove(pending_release_.begin(), pending_release_.end(), slot),
      pending_release_.end());
  Status status = s.group->ReleaseAll(options_.pinned_pool);
  status.Update(ReloadAhead(backward_chunk_));
  return status.WithContext(where + " of " + SlotName(slot));
}

Status PipelinePolicy::ReloadAhead(int chunk_index) {
  // The next offloaded group of this chunk, in reverse commit order; one
  // group ahead only (upstream runs several ahead under partial offload
  // and raises the peak: SPEC §5.8e).
  const Chunk& chunk = chunks_[chunk_index];
  for (int i = chunk.backward_next; i < static_cast<int>(chunk.commits.size());
       ++i) {
    OffloadGroup& group =
        *slots_[chunk.commits[chunk.commits.size() - 1 - i]].group;
    if (group.state() == GroupState::kReloadStarted) return OkStatus();
    if (group.state() == GroupState::kOffloadFinished) {
      return group.StartReload();
    }
  }
  // None left: pre-reload, once, the first group to run backward in the
  // next chunk, if that chunk's forward has ended.
  const int next = FrontChunk();
  if (next < 0 || !chunks_[next].forward_ended || chunks_[next].prereloaded) {
    return OkStatus();
  }
  Chunk& ahead = chunks_[next];
  ahead.prereloaded = true;
  for (auto it = ahead.commits.rbegin(); it != ahead.commits.rend(); ++it) {
    OffloadGroup& group = *slots_[*it].group;
    if (group.state() == GroupState::kReloadStarted) return OkStatus();
    if (group.state() == GroupState::kOffloadFinished) {
      return group.StartReload();
    }
  }
  return OkStatus();
}

Status PipelinePolicy::FinishIteration() {
  if (!options_.enabled) return OkStatus();
  const std::string where = "FinishIteration of " + Iteration();
  for (const Chunk& chunk : chunks_) {
    if (!chunk.backward_begun ||
        chunk.backward_next < static_cast<int>(chunk.commits.size()) ||
        !chunk.running.empty() || !chunk.open.empty()) {
      return FailedPreconditionError(where + ": the backward of " +
                                     chunk.id.ToString() + " did not end");
    }
  }
  OFFLOAD_RETURN_IF_ERROR(order_.CheckComplete().WithContext(where));
  if (warmed_up_ && chunks_.size() != recorded_.size()) {
    return FailedPreconditionError(
        where + ": the workload changed after the warm-up: " +
        std::to_string(chunks_.size()) + " chunks ran, warm-up ran " +
        std::to_string(recorded_.size()));
  }
  Status first = IssueDelayedOffloads(DelayedIssue::kLeftOver, where);
  if (!warmed_up_) Freeze();
  first.Update(ResetIteration());
  return first.WithContext(where + " (the iteration ended)");
}

Status PipelinePolicy::AbandonIteration() {
  if (!options_.enabled) return OkStatus();
  const std::string where = "AbandonIteration of " + Iteration();
  if (Capturing()) {
    return FailedPreconditionError(
        where + ": not during a graph capture (end the capture first)");
  }
  if (chunks_.empty()) return OkStatus();  // between iterations
  int forward = 0;
  for (const Chunk& chunk : chunks_) forward += chunk.forward_ended ? 1 : 0;
  if (forward_chunk_ >= 0) ++forward;  // the one running
  core_.Warn(where + ": dropped after " + std::to_string(forward) +
             " chunks' forward (" + std::to_string(backward_chunks_) +
             " began their backward" +
             (warmed_up_ ? "" : "; the warm-up runs again") +
             "); its memory was released");
  delayed_.clear();  // never issued: their tensors go with the groups
  Status first = ResetIteration();
  if (!warmed_up_) {  // a partial record: the next iteration records anew
    slots_.clear();
    recorded_.clear();
  }
  return first.WithContext(where + " (the iteration ended)");
}

Status PipelinePolicy::ResetIteration() {
  Status first = OkStatus();
  for (Slot& slot : slots_) {
    if (slot.group->state() != GroupState::kReleased) {
      first.Update(slot.group->ReleaseAll(options_.pinned_pool));
    }
    slot.group->BeginIteration();
    slot.offload = slot.committed = false;
    slot.backward_begun = slot.backward_ended = false;
  }
  first.Update(core_.RetryKept());
  chunks_.clear();
  kept_storages_.clear();
  order_ = ChunkOrder(options_.virtual_stages);
  handles_.NextIteration();
  next_slot_ = 0;
  forward_chunk_ = backward_chunk_ = -1;
  backward_chunks_ = 0;
  pending_release_.clear();
  return first;
}

void PipelinePolicy::Freeze() {
  std::vector<int> backward = order_.backward();
  plan_ = FreezePlan(recorded_, backward,
                     FreezeOptions{options_.pipeline_rank,
                                   options_.delta_offload_bytes,
                                   options_.activation_offload_fraction});
  recorded_groups_.clear();
  recorded_count_.clear();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    recorded_groups_.push_back(static_cast<int>(chunks_[c].slots.size()));
    recorded_count_.push_back(chunks_[c].count);
    for (size_t g = 0; g < chunks_[c].commits.size(); ++g) {
      slots_[chunks_[c].commits[g]].decision = plan_.decision[c][g];
    }
  }
  summary_ = Summarize(recorded_, plan_, options_.pipeline_rank);
  if (summary_->caller_held_bytes > 0) {
    core_.Warn("warm-up: " + std::to_string(summary_->caller_held_bytes) +
               " B copied to host per iteration stay on device because the "
               "caller keeps their storages (duplicate copies that save no "
               "memory; SPEC §2.5)");
  }
  warmed_up_ = true;
}

GroupDecision PipelinePolicy::Decision(int chunk, int index) const {
  if (!warmed_up_ || chunk < 0 ||
      chunk >= static_cast<int>(plan_.decision.size()) || index < 0 ||
      index >= static_cast<int>(plan_.decision[chunk].size())) {
    return GroupDecision::kNotEligible;
  }
  return plan_.decision[chunk][index];
}

GroupState PipelinePolicy::state(int stage, int microbatch,
                                          std::string_view name,
                                          int ordinal) const {
  for (int slot = 0; slot < next_slot_; ++slot) {
    const Slot& s = slots_[slot];
    if (chunks_[s.chunk].id == ChunkId{stage, microbatch} && s.name == name &&
        s.ordinal == ordinal) {
      return s.group->state();
    }
  }
  return GroupState::kNotOffloaded;
}

int64_t PipelinePolicy::OffloadedBytes() const {
  int64_t total = core_.pinned().bytes();
  for (const Slot& slot : slots_) total += slot.group->host_bytes();
  return total;
}

}  // namespace offload
