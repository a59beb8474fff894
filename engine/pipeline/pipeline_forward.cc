// The fine-grained policy, forward side: chunks, nested groups, pushes and
// commits (SPEC §5.1, §5.2, §5.6).

#include <algorithm>
#include <string>
#include <utility>

#include "engine/core/push_checks.h"
#include "engine/pipeline/pipeline_policy.h"

namespace offload {

PipelinePolicy::PipelinePolicy(Backend& backend,
                              const PipelineOffloadOptions& options,
                              Stream& d2h, Stream& h2d)
    : options_(options),
      core_(backend, d2h, h2d,
            CoreOptions{options.min_span_coverage, options.skip_sparse_views,
                        options.warnings_to_stderr}),
      order_(options.virtual_stages) {}

std::string PipelinePolicy::SlotName(int slot) const {
  const Slot& s = slots_[slot];
  return "group '" + s.name + "' #" + std::to_string(s.ordinal) + " of " +
         chunks_[s.chunk].id.ToString() + " in " + Iteration();
}

int PipelinePolicy::FrontChunk() const {
  const std::vector<int>& backward = order_.backward();
  return backward_chunks_ < static_cast<int>(backward.size())
             ? backward[backward_chunks_]
             : -1;
}

Status PipelinePolicy::FreeDropped() {
  Status first = OkStatus();
  std::vector<int> still;
  for (int slot : pending_release_) {
    OffloadGroup& group = *slots_[slot].group;
    first.Update(group.FreeDroppedStorages());
    if (group.holds_caller_storages()) still.push_back(slot);
  }
  pending_release_ = std::move(still);
  return first;
}

Status PipelinePolicy::CheckForwardChunkCanEnd(
    const std::string& where) const {
  if (forward_chunk_ < 0) return OkStatus();
  const Chunk& chunk = chunks_[forward_chunk_];
  if (!chunk.open.empty()) {
    return FailedPreconditionError(
        where + ": " + SlotName(chunk.open.back()) +
        " is still open (GroupCommit it first)");
  }
  if (warmed_up_ && static_cast<int>(chunk.slots.size()) !=
                        recorded_groups_[forward_chunk_]) {
    return FailedPreconditionError(
        where + ": the workload changed after the warm-up: " +
        chunk.id.ToString() + " ran " + std::to_string(chunk.slots.size()) +
        " groups, warm-up ran " +
        std::to_string(recorded_groups_[forward_chunk_]));
  }
  return OkStatus();
}

void PipelinePolicy::EndForwardChunk() {
  if (forward_chunk_ >= 0) chunks_[forward_chunk_].forward_ended = true;
  forward_chunk_ = -1;
}

Status PipelinePolicy::StartChunk(int stage, int microbatch) {
  if (!options_.enabled) return OkStatus();
  const ChunkId id{stage, microbatch};
  const std::string where = "StartChunk(" + id.ToString() + ") in " +
                            Iteration();
  if (stage < 0 || stage >= options_.virtual_stages || microbatch < 0) {
    return InvalidArgumentError(
        where + ": the stage must be in [0, " +
        std::to_string(options_.virtual_stages) +
        ") (virtual_stages) and the microbatch >= 0");
  }
  for (const Chunk& chunk : chunks_) {
    if (chunk.id == id) {
      return FailedPreconditionError(where + ": that chunk already ran");
    }
  }
  OFFLOAD_RETURN_IF_ERROR(CheckForwardChunkCanEnd(where));
  const int index = static_cast<int>(chunks_.size());
  if (warmed_up_ && (index >= static_cast<int>(recorded_.size()) ||
                     !(recorded_[index].id == id))) {
    return FailedPreconditionError(
        where + ": the workload changed after the warm-up: chunk #" +
        std::to_string(index) + " was " +
        (index < static_cast<int>(recorded_.size())
             ? recorded_[index].id.ToString()
             : std::string("not run")) +
        " then");
  }
  // Memory the caller dropped goes first: if that fails, nothing changed.
  OFFLOAD_RETURN_IF_ERROR(FreeDropped().WithContext(where));
  EndForwardChunk();
  Chunk chunk;
  chunk.id = id;
  chunks_.push_back(std::move(chunk));
  if (!warmed_up_) recorded_.push_back(RecordedChunk{id, {}});
  order_.AddForward(index, stage);
  forward_chunk_ = index;
  return OkStatus();
}

Status PipelinePolicy::GroupStart(std::string_view name) {
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "GroupStart('" + std::string(name) + "') in " + Iteration();
  if (forward_chunk_ < 0) {
    return FailedPreconditionError(where + ": no chunk's forward is running "
                                   "(StartChunk first)");
  }
  Chunk& chunk = chunks_[forward_chunk_];
  const int slot = next_slot_;
  if (warmed_up_ && (slot >= static_cast<int>(slots_.size()) ||
                     slots_[slot].chunk != forward_chunk_ ||
                     slots_[slot].name != name)) {
    return FailedPreconditionError(
        where + " in " + chunk.id.ToString() +
        ": the workload changed after the warm-up: group #" +
        std::to_string(slot) + " was " +
        (slot < static_cast<int>(slots_.size())
             ? "'" + slots_[slot].name + "' of chunk #" +
                   std::to_string(slots_[slot].chunk)
             : std::string("not run")) +
        " then");
  }
  OFFLOAD_RETURN_IF_ERROR(FreeDropped().WithContext(where));
  auto count = chunk.count.find(name);
  const int ordinal = count == chunk.count.end() ? 0 : count->second;
  if (!warmed_up_) {
    Slot s;
    s.chunk = forward_chunk_;
    s.name = std::string(name);
    s.ordinal = ordinal;
    s.eligible = std::find(options_.offload_modules.begin(),
                           options_.offload_modules.end(),
                           name) != options_.offload_modules.end();
    s.group = std::make_unique<OffloadGroup>(
        core_,
        "group '" + s.name + "' #" + std::to_string(ordinal) + " of " +
            chunk.id.ToString(),
        OffloadGroup::kPinnedTagPerDType);
    slots_.push_back(std::move(s));
  }
  Slot& s = slots_[slot];
  s.offload = s.eligible;
  if (warmed_up_ && s.decision != GroupDecision::kOffload) s.offload = false;
  // The run-time margin (§5.4a): in the chunk whose backward comes next,
  // the last group of each name stays on device (its reload could not
  // overlap anything).
  if (warmed_up_ && s.offload && FrontChunk() == forward_chunk_ &&
      ordinal == recorded_count_[forward_chunk_].find(name)->second - 1) {
    s.offload = false;
  }
  chunk.count[std::string(name)] = ordinal + 1;
  chunk.slots.push_back(slot);
  chunk.open.push_back(slot);
  ++next_slot_;
  return OkStatus();
}

Status PipelinePolicy::CheckNotCapturing(
    int slot, const std::string& call) const {
  if (options_.delay_offload || !Capturing()) return OkStatus();
  // Not capture-safe: the offload allocates pinned memory (the pool may
  // have to), a push records its ready point into the graph (where no
  // eager copy may wait for it), and the copies and the release would be
  // captured.
  return FailedPreconditionError(
      call + " of " + SlotName(slot) +
      ": the compute stream is capturing a graph and the group is "
      "offloaded; without delay_offload its offload cannot be captured "
      "(set delay_offload and call IssueDelayedOffloads after the region's "
      "Launch); nothing changed");
}

SavedTensor PipelinePolicy::KeptHandle(const Tensor& tensor, int slot) {
  if (tensor.storage != nullptr &&
      (kept_storages_.empty() ||
       kept_storages_.back().lock() != tensor.storage)) {
    kept_storages_.push_back(tensor.storage);
  }
  return handles_.Kept(tensor, slot);
}

StatusOr<SavedTensor> PipelinePolicy::PushOne(const Tensor& tensor,
                                                       int slot) {
  if (NeverOffloaded(tensor, options_.min_offload_elements)) {
    ++core_.stats().tensors_kept;
    return KeptHandle(tensor, slot);
  }
  int index = -1;
  if (options_.delay_offload && tensor.ready == nullptr) {
    // §5.7: the copies must follow what the compute stream runs up to the
    // issue (a region launched after this push, or captured with it), not
    // the push: the pushes share the slot's issue event, recorded then.
    std::shared_ptr<Event>& ready = slots_[slot].issue_ready;
    if (ready == nullptr) {
      OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Event> event,
                               core_.backend().NewEvent());
      ready = std::move(event);
    }
    // Added with that event as its ready point; the tensor itself stays as
    // pushed (Pop hands it back unchanged, never with the engine's event).
    index = slots_[slot].group->Add(tensor, ready, /*ready_from_push=*/false);
  } else {
    OFFLOAD_ASSIGN_OR_RETURN(index, slots_[slot].group->AddPushed(tensor));
  }
  ++core_.stats().tensors_offloaded;
  return handles_.InGroup(slot, slot, index);
}

StatusOr<SavedTensor> PipelinePolicy::Push(const Tensor& tensor) {
  if (!options_.enabled || forward_chunk_ < 0 ||
      chunks_[forward_chunk_].open.empty()) {
    return KeptHandle(tensor, -1);
  }
  const int slot = chunks_[forward_chunk_].open.back();
  if (!slots_[slot].offload) return KeptHandle(tensor, slot);  // §4.4
  OFFLOAD_RETURN_IF_ERROR(CheckNotCapturing(slot, "Push"));
  OFFLOAD_RETURN_IF_ERROR(
      CheckOffloadable(tensor, core_.backend(), options_.min_offload_elements,
                       WhereFn([&] { return "Push in " + SlotName(slot); })));
  return PushOne(tensor, slot);
}

StatusOr<SavedTensor> PipelinePolicy::Push(const CompositeTensor& tensor) {
  int slot = -1;
  if (options_.enabled && forward_chunk_ >= 0 &&
      !chunks_[forward_chunk_].open.empty()) {
    slot = chunks_[forward_chunk_].open.back();
  }
  CompositePush push;
  push.slot = slot;
  push.offloaded = slot >= 0 && slots_[slot].offload;
  if (push.offloaded) {
    OFFLOAD_RETURN_IF_ERROR(CheckNotCapturing(slot, "Push"));
  }
  push.min_elements = options_.min_offload_elements;
  push.where = [this, slot] { return "Push in " + SlotName(slot); };
  push.push_one = [this, slot](const Tensor& t) { return PushOne(t, slot); };
  const int size = push.offloaded ? slots_[slot].group->size() : 0;
  push.undo = [this, slot, size] { slots_[slot].group->Truncate(size); };
  return PushComposite(tensor, push, handles_, core_.backend(), core_.stats());
}

std::vector<const Storage*> PipelinePolicy::ForcedReleases(
    int slot, const std::vector<Tensor>& release) {
  std::vector<const Storage*> force;
  const OffloadGroup& group = *slots_[slot].group;
  for (const Tensor& tensor : release) {
    const Storage* storage = tensor.storage.get();
    if (storage == nullptr) continue;
    if (!group.CopiesStorage(storage)) {
      core_.Warn("GroupCommit of " + SlotName(slot) + ": release tensor " +
                 tensor.Describe() + " was not copied by this group; its "
                 "memory is not released");
      continue;
    }
    // Someone else still needs it (§5.8h, issue 21): then the group holds
    // it as if the caller did — freed once nobody holds it, never under a
    // copy still to come or a handle that reads it.
    const std::string holder = OtherHolder(slot, storage);
    if (!holder.empty()) {
      core_.Warn("GroupCommit of " + SlotName(slot) + ": release tensor " +
                 tensor.Describe() + " is not released yet: " + holder);
      continue;
    }
    force.push_back(storage);
  }
  return force;
}

std::string PipelinePolicy::OtherHolder(int slot,
                                        const Storage* storage) const {
  for (int open : chunks_[slots_[slot].chunk].open) {
    if (slots_[open].group->References(storage)) {
      return "the open group " + SlotName(open) + " has still to copy it";
    }
  }
  for (const Delayed& queued : delayed_) {  // not issued yet
    if (slots_[queued.slot].group->References(storage)) {
      return "the delayed offload of " + SlotName(queued.slot) +
             " has still to copy it";
    }
  }
  for (const std::weak_ptr<Storage>& kept : kept_storages_) {
    if (kept.lock().get() == storage) {
      return "another handle still reads it (a tensor kept on device)";
    }
  }
  if (slots_[slot].group->LeavesOnDevice(storage)) {
    return "another handle still reads it (a view of this group left on "
           "device)";
  }
  for (int other = 0; other < next_slot_; ++other) {
    if (other != slot && slots_[other].group->References(storage)) {
      return "another handle still reads it (a tensor of " +
             SlotName(other) + " on device)";
    }
  }
  return "";
}

Status PipelinePolicy::GroupCommit(
    std::string_view name, const std::vector<Tensor>& release_tensors) {
  if (!options_.enabled) return OkStatus();
  const std::string where =
      "GroupCommit('" + std::string(name) + "') in " + Iteration();
  if (forward_chunk_ < 0) {
    return FailedPreconditionError(where + ": no chunk's forward is running");
  }
  Chunk& chunk = chunks_[forward_chunk_];
  auto open = std::find_if(chunk.open.rbegin(), chunk.open.rend(),
                           [&](int s) { return slots_[s].name == name; });
  if (open == chunk.open.rend()) {
    return FailedPreconditionError(where + " in " + chunk.id.ToString() +
                                   ": no open group of that name");
  }
  const int slot = *open;
  if (slots_[slot].offload) {
    OFFLOAD_RETURN_IF_ERROR(CheckNotCapturing(slot, where));
  }
  OFFLOAD_RETURN_IF_ERROR(FreeDropped().WithContext(where));
  chunk.open.erase(std::next(open).base());
  chunk.commits.push_back(slot);
  Slot& s = slots_[slot];
  s.committed = true;
  Status status = OkStatus();
  if (s.offload && options_.delay_offload) {
    delayed_.push_back(Delayed{slot, release_tensors});
  } else if (s.offload) {
    status = Offload(slot, release_tensors);
  }
  if (!warmed_up_) {  // bytes and outcome are filled in at backward end
    recorded_[forward_chunk_].groups.push_back(
        RecordedGroup{s.name, s.ordinal, false, 0, 0});
  }
  return status.WithContext(where + " of " + SlotName(slot) +
                            " (committed)");
}

Status PipelinePolicy::Offload(int slot,
                                        const std::vector<Tensor>& release) {
  OffloadGroup& group = *slots_[slot].group;
  OFFLOAD_RETURN_IF_ERROR(group.StartOffload(options_.pinned_pool));
  if (group.state() != GroupState::kOffloadStarted) return OkStatus();
  Status status = group.ReleaseAfterCopies(ForcedReleases(slot, release));
  if (group.holds_caller_storages()) pending_release_.push_back(slot);
  if (status.ok()) status = ApplyCap(slot);
  return status;
}

Status PipelinePolicy::IssueDelayedOffloads(DelayedIssue issue,
                                            const std::string& caller) {
  const bool explicit_call = issue == DelayedIssue::kExplicit;
  if ((explicit_call || !delayed_.empty()) && Capturing()) {
    // Issued now, the copies would be captured into the graph: what
    // delaying avoids. The queue stays.
    std::string names;
    for (const Delayed& d : delayed_) names += " " + SlotName(d.slot) + ";";
    return FailedPreconditionError(
        caller + " in " + Iteration() +
        ": the compute stream is capturing a graph; delayed offloads are "
        "issued outside the capture: call IssueDelayedOffloads after the "
        "region's Launch (" + std::to_string(delayed_.size()) +
        " still queued" + (names.empty() ? "" : ":" + names) +
        "); nothing changed");
  }
  if (delayed_.empty()) return OkStatus();
  if (!explicit_call) {
    std::string names;
    for (const Delayed& d : delayed_) names += " " + SlotName(d.slot) + ";";
    core_.Warn(caller + ": " + std::to_string(delayed_.size()) +
               " delayed offloads were still queued and are issued now "
               "(call IssueDelayedOffloads after each launch):" + names);
  }
  // Issued in commit order; the queue is empty afterwards whatever fails.
  std::vector<Delayed> queue = std::move(delayed_);
  delayed_.clear();
  Status first = OkStatus();
  for (size_t i = 0; i < queue.size(); ++i) {
    // The ready point of its pushes: here, after everything the compute
    // stream was given (the region's launch). Without it the group stays
    // on device (correct as pushed) and the error is reported.
    const std::shared_ptr<Event>& ready = slots_[queue[i].slot].issue_ready;
    if (ready != nullptr) {
      Status recorded = core_.compute().Record(*ready);
      if (!recorded.ok()) {
        first.Update(recorded.WithContext(
            SlotName(queue[i].slot) +
            ": recording its ready point (its tensors stay on device)"));
        continue;
      }
    }
    first.Update(Offload(queue[i].slot, queue[i].release)
                     .WithContext(SlotName(queue[i].slot)));
  }
  return first;
}

Status PipelinePolicy::ApplyCap(int slot) {
  auto cap = options_.max_inflight.find(slots_[slot].name);
  if (cap == options_.max_inflight.end()) return OkStatus();
  std::deque<int>& inflight =
      chunks_[slots_[slot].chunk].inflight[slots_[slot].name];
  inflight.push_back(slot);
  while (static_cast<int>(inflight.size()) > cap->second) {
    OFFLOAD_RETURN_IF_ERROR(slots_[inflight.front()].group->ComputeWaitsForOffload());
    inflight.pop_front();
  }
  return OkStatus();
}

}  // namespace offload
