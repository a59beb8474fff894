#include "engine/group.h"

#include <algorithm>
#include <map>
#include <utility>

#include "engine/group_processor.h"

namespace offload {
namespace {

std::string Bytes(int64_t n) { return std::to_string(n) + " B"; }

std::string Percent(double fraction) {
  return std::to_string(static_cast<int>(fraction * 1000.0 + 0.5) / 10) + "." +
         std::to_string(static_cast<int>(fraction * 1000.0 + 0.5) % 10) + "%";
}

}  // namespace

std::string Group::Where() const {
  return "layer " + std::to_string(layer_) + " (" + GroupStateName(state_) +
         ")";
}

Status Group::WrongState(const char* call) const {
  return FailedPreconditionError(std::string(call) + " of " + Where() +
                                 ": not allowed in this state");
}

int Group::Add(const Tensor& tensor, std::shared_ptr<Event> ready,
               bool ready_from_push) {
  Entry entry;
  entry.tensor = tensor;
  entry.ready = std::move(ready);
  if (ready_from_push) entry.push_order = static_cast<int>(next_push_event_) - 1;
  entry.byte_offset = tensor.offset * tensor.element_size();
  entries_.push_back(std::move(entry));
  return static_cast<int>(entries_.size()) - 1;
}

StatusOr<std::shared_ptr<Event>> Group::NextPushEvent(const GroupContext& ctx) {
  if (next_push_event_ == push_events_.size()) {
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Event> event,
                             ctx.backend->NewEvent());
    push_events_.push_back(std::move(event));
  }
  return push_events_[next_push_event_++];
}

StatusOr<Event*> Group::EnsureEvent(std::unique_ptr<Event>& event,
                                    const GroupContext& ctx) {
  if (event == nullptr) {
    OFFLOAD_ASSIGN_OR_RETURN(event, ctx.backend->NewEvent());
  }
  return event.get();
}

bool Group::MakeContiguous(int index, double coverage,
                           const GroupContext& ctx) {
  Entry& entry = entries_[index];
  const Tensor& view = entry.tensor;
  StatusOr<Buffer> buffer =
      ctx.backend->AllocateDevice(view.nbytes(), *ctx.compute);
  if (!buffer.ok()) {
    ctx.diagnostics->Warn(
        Where() + ": tensor " + view.Describe() + " is a sparse view and no " +
        "device memory was left to make it contiguous (" +
        buffer.status().ToString() + "); it stays on device");
    return false;
  }
  // The gather runs on the compute stream (never a copy stream: a kernel
  // there could stall behind busy SMs), after the view's ready point.
  if (entry.ready != nullptr) (void)ctx.compute->Wait(*entry.ready);
  Status status = ctx.compute->Gather(
      buffer->data(),
      static_cast<const char*>(view.storage->data()) + entry.byte_offset,
      view.element_size(), view.shape, view.strides);
  if (!status.ok()) {
    ctx.diagnostics->Warn(Where() + ": making tensor " + view.Describe() +
                          " contiguous failed (" + status.ToString() +
                          "); it stays on device");
    (void)ctx.backend->Free(*buffer, *ctx.compute);
    return false;
  }
  ctx.diagnostics->Warn(
      Where() + ": tensor " + view.Describe() + " covers " +
      Percent(coverage) + " of the bytes it spans; made contiguous on the " +
      "compute stream, so it comes back from Pop as a contiguous tensor");
  Tensor copy = view;
  copy.storage = std::make_shared<Storage>(std::move(buffer).value());
  copy.strides = ContiguousStrides(view.shape);
  copy.offset = 0;
  entry.tensor = std::move(copy);
  entry.byte_offset = 0;
  entry.ready = nullptr;  // ready at the group's gathered point
  ++ctx.stats->views_made_contiguous;
  return true;
}

Status Group::StartOffload(const GroupContext& ctx) {
  if (state_ != GroupState::kNotOffloaded) return WrongState("StartOffload");
  const OffloadOptions& options = *ctx.options;

  std::vector<const Tensor*> views;
  views.reserve(entries_.size());
  for (const Entry& entry : entries_) views.push_back(&entry.tensor);
  GroupPlan plan = PlanGroup(views, options.min_span_coverage);

  // The spans this iteration will copy: the plan's, then one per sparse view
  // made contiguous. Retained pinned buffers must fit them exactly.
  std::vector<int64_t> sizes;
  for (const PlannedSpan& span : plan.spans) sizes.push_back(span.bytes());
  if (!options.skip_sparse_views) {
    for (int index : plan.sparse) sizes.push_back(views[index]->nbytes());
  }
  if (!host_.empty()) {
    bool same = host_.size() == sizes.size();
    for (size_t i = 0; same && i < sizes.size(); ++i) {
      same = host_[i].size() == sizes[i];
    }
    if (!same) {
      std::string was, now;
      for (const Buffer& b : host_) was += " " + std::to_string(b.size());
      for (int64_t size : sizes) now += " " + std::to_string(size);
      return FailedPreconditionError(
          "StartOffload of " + Where() + ": retain_pinned_buffers keeps the "
          "pinned buffers of the first iteration, so the saved tensors' "
          "shapes must not change; span bytes were [" + was + " ], now [" +
          now + " ]");
    }
  }

  // Pinned buffers first: without them the group stays on device.
  if (host_.empty() && !sizes.empty()) {
    std::vector<Buffer> hosts;
    for (int64_t size : sizes) {
      StatusOr<Buffer> host = ctx.backend->AllocatePinned(size);
      if (!host.ok()) {
        int64_t total = 0;
        for (int64_t s : sizes) total += s;
        ctx.diagnostics->Warn(
            Where() + ": pinned allocation of " + Bytes(total) + " failed (" +
            host.status().ToString() + "); the group's " +
            std::to_string(entries_.size()) + " tensors stay on device");
        on_device_ = true;
        state_ = GroupState::kOffloadStarted;
        return OkStatus();  // `hosts` were never used: dropping them is safe
      }
      hosts.push_back(std::move(host).value());
      ++ctx.stats->pinned_allocations;
    }
    host_ = std::move(hosts);
    host_free_pending_ = false;
  }

  // Spans, then contiguous copies of sparse views as spans of their own.
  spans_.clear();
  for (const PlannedSpan& planned : plan.spans) {
    Span span;
    span.device = planned.storage;
    span.begin = planned.begin;
    span.bytes = planned.bytes();
    span.entries = planned.tensors;
    for (int index : planned.tensors) {
      entries_[index].span = static_cast<int>(spans_.size());
    }
    spans_.push_back(std::move(span));
  }
  std::vector<int> copied;
  for (size_t i = 0; i < plan.sparse.size(); ++i) {
    int index = plan.sparse[i];
    if (options.skip_sparse_views) {
      ctx.diagnostics->Warn(Where() + ": tensor " +
                            entries_[index].tensor.Describe() + " covers " +
                            Percent(plan.sparse_coverage[i]) +
                            " of the bytes it spans; not offloaded "
                            "(skip_sparse_views)");
      continue;
    }
    Span span;  // a placeholder keeps host_ and spans_ aligned on failure
    if (MakeContiguous(index, plan.sparse_coverage[i], ctx)) {
      span.device = entries_[index].tensor.storage;
      span.bytes = entries_[index].tensor.nbytes();
      span.entries = {index};
      entries_[index].span = static_cast<int>(spans_.size());
      copied.push_back(index);
    }
    spans_.push_back(std::move(span));
  }
  Status copies = EnqueueOffloadCopies(!copied.empty(), ctx);
  if (!copies.ok()) {
    // The device bytes are intact: keep the group there.
    ctx.diagnostics->Warn(Where() + ": enqueueing the offload failed (" +
                          copies.ToString() + "); the group's " +
                          std::to_string(entries_.size()) +
                          " tensors stay on device");
    // Copies enqueued before the failure may still read the device
    // storages: whatever frees them later must be ordered after them.
    StatusOr<Event*> done = EnsureEvent(offload_done_, ctx);
    if (!done.ok() || !ctx.d2h->Record(**done).ok()) {
      (void)ctx.d2h->Synchronize();  // no event to wait for: drain instead
    }
    if (!options.retain_pinned_buffers) {
      for (Buffer& host : host_) (void)ctx.backend->Free(host, *ctx.d2h);
      host_.clear();
    }
    on_device_ = true;
  }
  state_ = GroupState::kOffloadStarted;
  return OkStatus();
}

Status Group::EnqueueOffloadCopies(bool gathered, const GroupContext& ctx) {
  if (gathered) {
    // Contiguous copies are ready once the compute stream reaches here.
    OFFLOAD_ASSIGN_OR_RETURN(Event * point, EnsureEvent(gathered_, ctx));
    OFFLOAD_RETURN_IF_ERROR(ctx.compute->Record(*point));
  }
  // Each span after the ready points of all its tensors.
  if (host_free_pending_ && host_free_ != nullptr) {
    OFFLOAD_RETURN_IF_ERROR(ctx.d2h->Wait(*host_free_));  // last reload done
    host_free_pending_ = false;
  }
  // Push events were recorded on the compute stream in push order, so
  // waiting for one covers every earlier one: per span, wait only for its
  // latest, and only if no later one was waited for already (the D2H stream
  // is FIFO). Events the caller gave (other streams) are each waited for.
  int waited_push = -1;
  std::vector<Event*> waited;
  for (size_t k = 0; k < spans_.size(); ++k) {
    Span& span = spans_[k];
    if (span.device == nullptr) continue;  // placeholder
    bool needs_gathered = false;
    const Entry* latest = nullptr;
    for (int index : span.entries) {
      const Entry& entry = entries_[index];
      Event* ready = entry.ready.get();
      if (ready == nullptr) {
        needs_gathered = true;
      } else if (entry.push_order >= 0) {
        if (latest == nullptr || entry.push_order > latest->push_order) {
          latest = &entry;
        }
      } else if (std::find(waited.begin(), waited.end(), ready) ==
                 waited.end()) {
        waited.push_back(ready);
        OFFLOAD_RETURN_IF_ERROR(ctx.d2h->Wait(*ready));
      }
    }
    if (latest != nullptr && latest->push_order > waited_push) {
      OFFLOAD_RETURN_IF_ERROR(ctx.d2h->Wait(*latest->ready));
      waited_push = latest->push_order;
    }
    if (needs_gathered) OFFLOAD_RETURN_IF_ERROR(ctx.d2h->Wait(*gathered_));
    host_last_user_ = ctx.d2h;
    OFFLOAD_RETURN_IF_ERROR(ctx.d2h->Copy(
        host_[k].data(),
        static_cast<const char*>(span.device->data()) + span.begin,
        span.bytes));
    ++ctx.stats->spans_offloaded;
    ctx.stats->bytes_offloaded += span.bytes;
  }
  OFFLOAD_ASSIGN_OR_RETURN(Event * done, EnsureEvent(offload_done_, ctx));
  return ctx.d2h->Record(*done);
}

void Group::DropDeviceStorages(const GroupContext& ctx) {
  // How many of the group's own references each storage has.
  std::map<Storage*, int> internal;
  for (const Span& span : spans_) {
    if (span.device != nullptr) ++internal[span.device.get()];
  }
  for (Entry& entry : entries_) {
    if (entry.span >= 0 && spans_[entry.span].device != nullptr) {
      entry.tensor.storage.reset();
    }
  }
  for (Span& span : spans_) {
    if (span.device == nullptr) continue;
    Storage* storage = span.device.get();
    auto it = internal.find(storage);
    if (it != internal.end()) {
      if (span.device.use_count() > it->second) {
        ctx.stats->bytes_retained_by_caller += span.bytes;
        ctx.diagnostics->Warn(
            Where() + ": " + Bytes(span.bytes) + " copied to host stay on " +
            "device because the caller still holds their storage; " +
            "offloading them saved no memory");
      } else if (it->second == 1) {
        (void)ctx.backend->Free(storage->mutable_buffer(), *ctx.compute);
      }
      if (--it->second == 0) internal.erase(it);
    }
    span.device.reset();
  }
}

Status Group::ReleaseForwardMemory(const GroupContext& ctx) {
  if (state_ != GroupState::kOffloadStarted) {
    return WrongState("ReleaseForwardMemory");
  }
  if (!on_device_) {
    // Nothing may reuse the memory before the copies reading it are done.
    if (offload_done_ != nullptr) {
      OFFLOAD_RETURN_IF_ERROR(ctx.compute->Wait(*offload_done_));
    }
    DropDeviceStorages(ctx);
  }
  state_ = GroupState::kOffloadFinished;
  return OkStatus();
}

Status Group::StartReload(const GroupContext& ctx) {
  if (state_ != GroupState::kOffloadFinished) return WrongState("StartReload");
  if (on_device_) {
    state_ = GroupState::kReloadStarted;
    return OkStatus();
  }
  // All device memory first, on the compute stream's pool: a failure leaves
  // everything as it was.
  std::vector<Buffer> buffers(spans_.size());
  for (size_t k = 0; k < spans_.size(); ++k) {
    if (spans_[k].bytes == 0) continue;  // placeholder
    StatusOr<Buffer> buffer =
        ctx.backend->AllocateDevice(spans_[k].bytes, *ctx.compute);
    if (!buffer.ok()) {
      for (Buffer& b : buffers) {
        if (!b.empty()) (void)ctx.backend->Free(b, *ctx.compute);
      }
      return Status(buffer.status().code(),
                    "StartReload of " + Where() + ": span " +
                        std::to_string(k) + " needs " +
                        Bytes(spans_[k].bytes) + " of device memory (" +
                        buffer.status().message() +
                        "); the host copy is kept, retry when memory is free");
    }
    buffers[k] = std::move(buffer).value();
  }
  while (span_reloaded_.size() < spans_.size()) span_reloaded_.emplace_back();
  for (auto& event : span_reloaded_) {
    OFFLOAD_RETURN_IF_ERROR(EnsureEvent(event, ctx).status());
  }
  OFFLOAD_ASSIGN_OR_RETURN(Event * point, EnsureEvent(reload_point_, ctx));
  // The H2D stream may touch the new memory only after its allocation point.
  OFFLOAD_RETURN_IF_ERROR(ctx.compute->Record(*point));
  OFFLOAD_RETURN_IF_ERROR(ctx.h2d->Wait(*point));
  Status copies = OkStatus();
  for (size_t k = 0; k < spans_.size() && copies.ok(); ++k) {
    if (buffers[k].empty()) continue;
    host_last_user_ = ctx.h2d;
    copies = ctx.h2d->Copy(buffers[k].data(), host_[k].data(), spans_[k].bytes);
    if (copies.ok()) copies = ctx.h2d->Record(*span_reloaded_[k]);
  }
  if (!copies.ok()) {
    // Free the new memory after whatever copies were enqueued; the host
    // copy stays for a retry.
    for (Buffer& b : buffers) {
      if (!b.empty()) (void)ctx.backend->Free(b, *ctx.h2d);
    }
    return Status(copies.code(), "StartReload of " + Where() + ": " +
                                     copies.message() +
                                     "; the host copy is kept, retry later");
  }
  for (size_t k = 0; k < spans_.size(); ++k) {
    if (buffers[k].empty()) continue;
    spans_[k].reloaded = std::make_shared<Storage>(std::move(buffers[k]));
    spans_[k].waited = false;
    ctx.stats->bytes_reloaded += spans_[k].bytes;
  }
  state_ = GroupState::kReloadStarted;
  return OkStatus();
}

StatusOr<Tensor> Group::Pop(int index, const GroupContext& ctx) {
  if (state_ == GroupState::kReleased) {
    return FailedPreconditionError(
        "Pop of tensor #" + std::to_string(index) + " of " + Where() +
        ": the group was released after its backward");
  }
  if (index < 0 || index >= static_cast<int>(entries_.size())) {
    return InternalError("Pop of tensor #" + std::to_string(index) + " of " +
                         Where() + ": no such tensor in the group");
  }
  const Entry& entry = entries_[index];
  switch (state_) {
    case GroupState::kOffloadFinished:
      if (entry.span >= 0 && !on_device_) {
        return FailedPreconditionError(
            "Pop of tensor " + entry.tensor.Describe() + " of " + Where() +
            ": its device memory was released and its reload never started");
      }
      break;
    default:
      break;
  }
  if (entry.span < 0 || on_device_ || state_ != GroupState::kReloadStarted) {
    return entry.tensor;  // still on device as pushed
  }
  Span& span = spans_[entry.span];
  if (!span.waited) {
    OFFLOAD_RETURN_IF_ERROR(ctx.compute->Wait(*span_reloaded_[entry.span]));
    span.waited = true;
  }
  Tensor tensor = entry.tensor;
  tensor.storage = span.reloaded;
  tensor.offset = (entry.byte_offset - span.begin) / tensor.element_size();
  tensor.ready = nullptr;
  return tensor;
}

void Group::FreeHost(const GroupContext& ctx) {
  for (Buffer& host : host_) {
    (void)ctx.backend->Free(host, host_last_user_ != nullptr ? *host_last_user_
                                                             : *ctx.d2h);
  }
  host_.clear();
  host_free_pending_ = false;
}

void Group::Shutdown(const GroupContext& ctx) {
  if (state_ != GroupState::kReleased) ReleaseAll(ctx, /*keep_pinned=*/false);
  FreeHost(ctx);
}

void Group::ReleaseAll(const GroupContext& ctx, bool keep_pinned) {
  if (state_ == GroupState::kOffloadStarted ||
      (on_device_ && state_ != GroupState::kNotOffloaded)) {
    // Copies may still read the device storages (also those enqueued
    // before a failure kept the group on device).
    if (offload_done_ != nullptr) (void)ctx.compute->Wait(*offload_done_);
  }
  if (state_ == GroupState::kOffloadStarted && !on_device_) {
    DropDeviceStorages(ctx);
  }
  for (size_t k = 0; k < spans_.size(); ++k) {
    Span& span = spans_[k];
    if (span.reloaded == nullptr) continue;
    if (span.reloaded.use_count() == 1) {
      // Never popped: the compute stream has not waited for the reload yet.
      if (!span.waited) (void)ctx.compute->Wait(*span_reloaded_[k]);
      (void)ctx.backend->Free(span.reloaded->mutable_buffer(), *ctx.compute);
    }
    span.reloaded.reset();
  }
  // Pinned buffers are free once the last copy that used them is done.
  if (!host_.empty()) {
    if (keep_pinned && host_last_user_ != nullptr) {
      StatusOr<Event*> free_point = EnsureEvent(host_free_, ctx);
      if (free_point.ok() && host_last_user_->Record(**free_point).ok()) {
        host_free_pending_ = true;
      }
    } else {
      FreeHost(ctx);
    }
  }
  entries_.clear();
  spans_.clear();
  state_ = GroupState::kReleased;
}

void Group::BeginIteration() {
  entries_.clear();
  spans_.clear();
  on_device_ = false;
  next_push_event_ = 0;
  state_ = GroupState::kNotOffloaded;
}

int64_t Group::host_bytes() const {
  int64_t total = 0;
  for (const Buffer& host : host_) total += host.size();
  return total;
}

}  // namespace offload
