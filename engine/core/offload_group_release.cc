// OffloadGroup's releases: dropping device storages, pinned buffers and
// reloaded spans, each ordered after the work that uses it (offload_group.h).

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/core/offload_group.h"

namespace offload {
namespace {

std::string Bytes(int64_t n) { return std::to_string(n) + " B"; }

}  // namespace

Status OffloadGroup::DropDeviceStorages(bool ordered, const Status& why) {
  for (Entry& entry : entries_) {
    if (entry.span >= 0 && spans_[entry.span].device != nullptr) {
      entry.tensor.storage.reset();
    }
  }
  if (!ordered) {
    // Copies may still read them: keep a reference to each until the
    // compute stream can be ordered after the D2H stream, whoever else
    // holds them (their last holder's free would race the copy too).
    std::vector<Storage*> seen;
    for (Span& span : spans_) {
      if (span.device == nullptr) continue;
      if (std::find(seen.begin(), seen.end(), span.device.get()) ==
          seen.end()) {
        seen.push_back(span.device.get());
        core_.Keep(span.device, core_.d2h(), Where(), why);
      }
      span.device.reset();
    }
    return OkStatus();
  }
  // How many of the group's own references each storage has.
  std::map<Storage*, int> internal;
  for (const Span& span : spans_) {
    if (span.device != nullptr) ++internal[span.device.get()];
  }
  Status first = OkStatus();
  for (Span& span : spans_) {
    if (span.device == nullptr) continue;
    if (span.device->data() == nullptr) {
      // Its memory was released already (another group's release_tensors,
      // after that group's own copy): nothing left to free.
      span.device.reset();
      continue;
    }
    auto it = internal.find(span.device.get());
    if (it != internal.end()) {
      if (span.device.use_count() > it->second ||
          span.device->memory().HeldOutside()) {
        core_.stats().bytes_retained_by_caller += span.bytes;
        core_.Warn(Where() + ": " + Bytes(span.bytes) + " copied to host "
                   "stay on device while the caller still holds their "
                   "storage (offloading them saves memory only once it lets "
                   "go: a model's forward holding its layer's input, say)");
      } else if (it->second == 1) {
        first.Update(core_.FreeOnCompute(
            span.device, std::function<std::string()>([this] { return Where(); })));
      }
      if (--it->second == 0) internal.erase(it);
    }
    span.device.reset();
  }
  return first;
}

Status OffloadGroup::ReleaseHost(bool retain_pinned) {
  if (host_.empty()) return OkStatus();
  Stream& last_user =
      host_last_user_ != nullptr ? *host_last_user_ : core_.d2h();
  Status status = OkStatus();
  if (retain_pinned) {
    status = core_.pinned().Give(std::move(host_), host_tags_, last_user);
  } else {
    std::vector<Buffer> failed;
    for (Buffer& host : host_) {
      Status freed = core_.backend().Free(host, last_user);
      if (!freed.ok()) {
        status.Update(freed);
        // Kept (never freed unordered): handed to the pool, which frees
        // it in order at the end.
        failed.push_back(std::move(host));
      }
    }
    if (!failed.empty()) {
      status.Update(core_.pinned().Give(std::move(failed), -1, last_user));
    }
  }
  host_.clear();
  host_tags_.clear();
  host_last_user_ = nullptr;
  return status;
}

Status OffloadGroup::ReleaseAfterCopies(
    const std::vector<const Storage*>& force) {
  if (state_ == GroupState::kKeptOnDevice) return OkStatus();
  if (state_ != GroupState::kOffloadStarted) {
    return WrongState("ReleaseAfterCopies");
  }
  OFFLOAD_RETURN_IF_ERROR(OrderD2HAfterCompute());
  state_ = GroupState::kOffloadFinished;
  released_unordered_ = true;
  for (Entry& entry : entries_) {
    if (entry.span >= 0 && spans_[entry.span].device != nullptr) {
      entry.tensor.storage.reset();
    }
  }
  return FreeDue(force);
}

Status OffloadGroup::FreeDroppedStorages() {
  if (!released_unordered_) return OkStatus();
  bool due = false;
  for (const Span& span : spans_) {
    due = due || (span.device != nullptr && span.device.use_count() == 1 &&
                  (span.device->data() == nullptr ||
                   !span.device->memory().HeldOutside()));
  }
  if (!due) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(OrderD2HAfterCompute());
  return FreeDue({});
}

bool OffloadGroup::holds_caller_storages() const {
  if (!released_unordered_) return false;
  for (const Span& span : spans_) {
    if (span.device != nullptr) return true;
  }
  return false;
}

Status OffloadGroup::OrderD2HAfterCompute() {
  // Work already enqueued on the compute stream may still read the
  // storages; the copies to host are on the D2H stream before the frees.
  OFFLOAD_ASSIGN_OR_RETURN(Event * point, EnsureEvent(order_point_));
  OFFLOAD_RETURN_IF_ERROR(core_.compute().Record(*point));
  return core_.d2h().Wait(*point);
}

Status OffloadGroup::FreeDue(const std::vector<const Storage*>& force) {
  Status first = OkStatus();
  for (Span& span : spans_) {
    if (span.device == nullptr) continue;
    if (span.device->data() == nullptr) {  // released elsewhere already
      span.device.reset();
      continue;
    }
    const bool forced = std::find(force.begin(), force.end(),
                                  span.device.get()) != force.end();
    if (!forced && (span.device.use_count() > 1 ||
                    span.device->memory().HeldOutside())) {
      continue;  // the caller still holds it
    }
    Status freed = span.device->memory().ReleaseAfter(core_.d2h());
    if (!freed.ok()) {
      first.Update(freed);
      core_.Keep(span.device, core_.d2h(), Where(), freed,
                 OffloadCore::KeepReason::kRefused);
    }
    span.device.reset();
  }
  return first;
}

Status OffloadGroup::ComputeWaitsForOffload() {
  if (offload_done_ == nullptr ||
      (state_ != GroupState::kOffloadStarted &&
       state_ != GroupState::kOffloadFinished &&
       state_ != GroupState::kReloadStarted)) {
    return OkStatus();
  }
  return core_.compute().Wait(*offload_done_);
}

bool OffloadGroup::References(const Storage* storage) const {
  for (const Entry& entry : entries_) {
    if (entry.tensor.storage.get() == storage) return true;
  }
  return false;
}

void OffloadGroup::Truncate(int size) {
  if (size >= 0 && size < static_cast<int>(entries_.size())) {
    entries_.resize(size);
  }
}

Status OffloadGroup::OrderAfterProducers() {
  // Entries that no copy ordered: never offloaded, kept on device, or left
  // on device (skipped sparse views). Their producer may have run on
  // another stream; once the group drops them, their last holder frees them
  // on its stream, so the compute stream first waits for their ready point.
  // (Push events were recorded on the compute stream: already ordered.)
  const bool none_copied = state_ == GroupState::kNotOffloaded ||
                           state_ == GroupState::kKeptOnDevice;
  Status first = OkStatus();
  std::vector<Event*> waited;
  for (Entry& entry : entries_) {
    if (entry.tensor.storage == nullptr || entry.ready == nullptr ||
        entry.push_order >= 0 || (!none_copied && entry.span >= 0)) {
      continue;
    }
    if (std::find(waited.begin(), waited.end(), entry.ready.get()) !=
        waited.end()) {
      continue;
    }
    Status status = core_.compute().Wait(*entry.ready);
    if (status.ok()) {
      waited.push_back(entry.ready.get());
      continue;
    }
    first.Update(status);
    core_.KeepUntil(entry.tensor.storage, entry.ready, Where(), status);
  }
  return first;
}

Status OffloadGroup::ReleaseAll(bool retain_pinned) {
  Status first = OrderAfterProducers();
  // Copies may still read the device storages.
  if (state_ == GroupState::kOffloadStarted) {
    Status ordered = offload_done_ != nullptr
                         ? core_.compute().Wait(*offload_done_)
                         : OkStatus();
    first.Update(ordered);
    first.Update(DropDeviceStorages(ordered.ok(), ordered));
  } else if (holds_caller_storages()) {
    // Released without the compute stream waiting, but the caller kept
    // some storages: before the group's reference goes (the caller's last
    // drop frees on the compute stream) the copies must be done.
    Status ordered = core_.compute().Wait(*offload_done_);
    first.Update(ordered);
    first.Update(DropDeviceStorages(ordered.ok(), ordered));
  } else if (state_ == GroupState::kKeptOnDevice && copies_pending_) {
    // Copies enqueued before a failure kept the group on device: the
    // storages go with the entries below, once the compute stream is
    // ordered after them.
    StatusOr<Event*> point = EnsureEvent(order_point_);
    Status ordered = point.ok() ? core_.ComputeWaitsFor(core_.d2h(), **point)
                                : point.status();
    if (!ordered.ok()) {
      first.Update(ordered);
      first.Update(DropDeviceStorages(/*ordered=*/false, ordered));
    }
  }
  first.Update(FreeReloaded());
  // Pinned buffers are free once the last copy that used them is done.
  first.Update(ReleaseHost(retain_pinned));
  entries_.clear();
  spans_.clear();
  copies_pending_ = false;
  released_unordered_ = false;
  state_ = GroupState::kReleased;
  return first;
}

Status OffloadGroup::DropReloaded() {
  if (state_ != GroupState::kReloadStarted) return OkStatus();
  Status first = FreeReloaded();
  state_ = GroupState::kOffloadFinished;
  return first;
}

Status OffloadGroup::FreeReloaded() {
  Status first = OkStatus();
  for (size_t k = 0; k < spans_.size(); ++k) {
    Span& span = spans_[k];
    if (span.reloaded == nullptr) continue;
    if (span.reloaded.use_count() == 1 && !span.reloaded->memory().HeldOutside()) {
      // Never popped: the compute stream has not waited for the reload yet.
      Status ordered = span.waited
                           ? OkStatus()
                           : core_.compute().Wait(*span_reloaded_[k]);
      if (ordered.ok()) {
        first.Update(core_.FreeOnCompute(
            span.reloaded,
            std::function<std::string()>([this] { return Where(); })));
      } else {
        first.Update(ordered);
        core_.Keep(span.reloaded, core_.h2d(), Where(), ordered);
      }
    }
    span.reloaded.reset();
    span.waited = false;
  }
  return first;
}

bool OffloadGroup::LeavesOnDevice(const Storage* storage) const {
  for (const Entry& entry : entries_) {
    if (entry.span < 0 && entry.tensor.storage.get() == storage) return true;
  }
  return false;
}

bool OffloadGroup::CopiesStorage(const Storage* storage) const {
  for (const Span& span : spans_) {
    if (span.device.get() == storage) return true;
  }
  return false;
}

int64_t OffloadGroup::caller_held_bytes() const {
  if (!released_unordered_) return 0;
  int64_t total = 0;
  for (const Span& span : spans_) {
    if (span.device != nullptr) total += span.bytes;
  }
  return total;
}

Status EndTraversal(OffloadCore& core,
                    std::vector<std::unique_ptr<OffloadGroup>>& groups) {
  Status first = OkStatus();
  for (auto& group : groups) {
    if (group != nullptr) first.Update(group->DropReloaded());
  }
  first.Update(core.RetryKept());
  return first;
}

bool AnyPushed(const std::vector<std::unique_ptr<OffloadGroup>>& groups) {
  for (const auto& group : groups) {
    if (group != nullptr && group->size() > 0) return true;
  }
  return false;
}

Status EndIteration(OffloadCore& core,
                    std::vector<std::unique_ptr<OffloadGroup>>& groups,
                    bool retain_pinned) {
  Status first = OkStatus();
  for (auto& group : groups) {
    if (group == nullptr) continue;
    if (group->state() != GroupState::kReleased) {
      first.Update(group->ReleaseAll(retain_pinned));
    }
    group->BeginIteration();
  }
  first.Update(core.RetryKept());
  return first;
}

}  // namespace offload
