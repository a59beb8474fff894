// OffloadGroup's bookkeeping and forward side: adding tensors, planning the
// spans and pinned blocks, the copies to host and the release of forward
// memory (offload_group.h). The reload and Pop are in
// offload_group_reload.cc, the releases in offload_group_release.cc.

#include "engine/core/offload_group.h"

#include <algorithm>
#include <map>
#include <utility>

#include "engine/core/offload_group_internal.h"
#include "engine/core/span_planner.h"

namespace offload {
namespace {

std::string Percent(double fraction) {
  return std::to_string(static_cast<int>(fraction * 1000.0 + 0.5) / 10) + "." +
         std::to_string(static_cast<int>(fraction * 1000.0 + 0.5) % 10) + "%";
}

}  // namespace

namespace offload_group_internal {

std::string Bytes(int64_t n) { return std::to_string(n) + " B"; }

// Spans share blocks (pinned: those of one pool tag; device: all of a
// reload). A span goes right after the previous one of its block when that
// one ends at a multiple of kSpanAlignment (as a backend aligns its own
// allocations), else it opens a block of its own: no padding, so blocks hold
// exactly the spans' bytes, and every span starts aligned.
constexpr int64_t kSpanAlignment = 256;

BlockLayout PackByTag(const std::vector<int64_t>& sizes,
                      const std::vector<int64_t>& tags) {
  BlockLayout layout;
  std::map<int64_t, int> open;  // tag -> its last block
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto it = open.find(tags[i]);
    if (it == open.end() ||
        layout.block_sizes[it->second] % kSpanAlignment != 0) {
      layout.block_tags.push_back(tags[i]);
      layout.block_sizes.push_back(0);
      it = open.insert_or_assign(
                   tags[i], static_cast<int>(layout.block_sizes.size()) - 1)
               .first;
    }
    layout.block.push_back(it->second);
    layout.offset.push_back(layout.block_sizes[it->second]);
    layout.block_sizes[it->second] += sizes[i];
  }
  return layout;
}

}  // namespace offload_group_internal

using offload_group_internal::BlockLayout;
using offload_group_internal::Bytes;
using offload_group_internal::PackByTag;

OffloadGroup::~OffloadGroup() {
  if (state_ == GroupState::kReleased) return;
  Status released = ReleaseAll(/*retain_pinned=*/false);
  if (!released.ok()) core_.Warn("destroying " + Where() + ": " +
                                 released.ToString());
}

std::string OffloadGroup::Where() const {
  return label_ + " (" + GroupStateName(state_) + ")";
}

Status OffloadGroup::WrongState(const char* call) const {
  return FailedPreconditionError(std::string(call) + " of " + Where() +
                                 ": not allowed in this state");
}

int OffloadGroup::Add(const Tensor& tensor, std::shared_ptr<Event> ready,
                      bool ready_from_push) {
  Entry entry;
  entry.tensor = tensor;
  entry.ready = std::move(ready);
  if (ready_from_push) entry.push_order = static_cast<int>(next_push_event_) - 1;
  entry.byte_offset = tensor.offset * tensor.element_size();
  entries_.push_back(std::move(entry));
  return static_cast<int>(entries_.size()) - 1;
}

StatusOr<int> OffloadGroup::AddPushed(const Tensor& tensor) {
  std::shared_ptr<Event> ready = tensor.ready;
  const bool from_push = ready == nullptr;
  if (from_push) {
    OFFLOAD_ASSIGN_OR_RETURN(ready, NextPushEvent());
    Status recorded = core_.compute().Record(*ready);
    if (!recorded.ok()) {
      --next_push_event_;  // unused: the next push takes it again
      return recorded;
    }
  }
  return Add(tensor, std::move(ready), from_push);
}

StatusOr<std::shared_ptr<Event>> OffloadGroup::NextPushEvent() {
  if (next_push_event_ == push_events_.size()) {
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Event> event,
                             core_.backend().NewEvent());
    push_events_.push_back(std::move(event));
  }
  return push_events_[next_push_event_++];
}

StatusOr<Event*> OffloadGroup::EnsureEvent(std::unique_ptr<Event>& event) {
  if (event == nullptr) {
    OFFLOAD_ASSIGN_OR_RETURN(event, core_.backend().NewEvent());
  }
  return event.get();
}

bool OffloadGroup::MakeContiguous(int index, double coverage) {
  Entry& entry = entries_[index];
  const Tensor& view = entry.tensor;
  Stream& compute = core_.compute();
  StatusOr<Buffer> buffer =
      core_.backend().AllocateDevice(view.nbytes(), compute);
  if (!buffer.ok()) {
    core_.Warn(Where() + ": tensor " + view.Describe() +
               " is a sparse view and no device memory was left to make it "
               "contiguous (" + buffer.status().ToString() +
               "); it stays on device");
    return false;
  }
  // The gather runs on the compute stream (never a copy stream: a kernel
  // there could stall behind busy SMs), after the view's ready point.
  Status status = OkStatus();
  if (entry.ready != nullptr) status = compute.Wait(*entry.ready);
  if (status.ok()) {
    status = compute.Gather(
        buffer->data(),
        static_cast<const char*>(view.storage->data()) + entry.byte_offset,
        view.element_size(), view.shape, view.strides);
  }
  if (!status.ok()) {
    // Nothing was enqueued that uses the new memory: its free on the
    // compute stream is ordered.
    Status freed = core_.backend().Free(*buffer, compute);
    core_.Warn(Where() + ": making tensor " + view.Describe() +
               " contiguous failed (" + status.ToString() +
               (freed.ok() ? "" : "; freeing its buffer: " + freed.ToString()) +
               "); it stays on device");
    return false;
  }
  core_.Warn(Where() + ": tensor " + view.Describe() + " covers " +
             Percent(coverage) + " of the bytes it spans; made contiguous "
             "on the compute stream, so it comes back from Pop as a "
             "contiguous tensor");
  Tensor copy = view;
  copy.storage = std::make_shared<Storage>(std::move(buffer).value());
  copy.strides = ContiguousStrides(view.shape);
  copy.offset = 0;
  entry.tensor = std::move(copy);
  entry.byte_offset = 0;
  entry.ready = nullptr;  // ready at the group's gathered point
  ++core_.stats().views_made_contiguous;
  return true;
}

void OffloadGroup::KeepOnDevice(const std::string& why) {
  core_.Warn(Where() + ": " + why + "; the group's " +
             std::to_string(entries_.size()) + " tensors stay on device");
  state_ = GroupState::kKeptOnDevice;
}

OffloadGroup::HostNeeds OffloadGroup::PlanHost() const {
  HostNeeds needs;
  std::vector<const Tensor*> views;
  views.reserve(entries_.size());
  for (const Entry& entry : entries_) views.push_back(&entry.tensor);
  needs.plan = PlanSpans(views, core_.options().min_span_coverage);
  // The spans this iteration will copy: the plan's, then one per sparse view
  // made contiguous. Retained pinned buffers must fit them exactly.
  auto tag = [&](const Tensor& view) {
    return pinned_tag_ >= 0 ? pinned_tag_
                            : -16 - static_cast<int64_t>(view.dtype);
  };
  for (const PlannedSpan& span : needs.plan.spans) {
    needs.sizes.push_back(span.bytes());
    needs.tags.push_back(tag(*views[span.tensors.front()]));
  }
  if (!core_.options().skip_sparse_views) {
    for (int index : needs.plan.sparse) {
      needs.sizes.push_back(views[index]->nbytes());
      needs.tags.push_back(tag(*views[index]));
    }
  }
  return needs;
}

std::vector<std::pair<int64_t, int64_t>> OffloadGroup::PlannedHostBlocks()
    const {
  const HostNeeds needs = PlanHost();
  const BlockLayout layout = PackByTag(needs.sizes, needs.tags);
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (size_t i = 0; i < layout.block_sizes.size(); ++i) {
    blocks.emplace_back(layout.block_sizes[i], layout.block_tags[i]);
  }
  return blocks;
}

Status OffloadGroup::StartOffload(bool retain_pinned) {
  if (state_ != GroupState::kNotOffloaded) return WrongState("StartOffload");
  const CoreOptions& options = core_.options();
  HostNeeds needs = PlanHost();
  const SpanPlan& plan = needs.plan;
  const std::vector<int64_t>& sizes = needs.sizes;
  const std::vector<int64_t>& tags = needs.tags;
  // (A pool shared by dtype serves any sizes; only a group's own retained
  // buffers must fit.)
  if (retain_pinned && pinned_tag_ >= 0 && !sizes.empty() &&
      !retained_sizes_.empty() &&
      retained_sizes_ != sizes) {
    // The saved tensors changed shape: the retained buffers no longer fit.
    // TE's rule (SPEC §3.5): an error naming the group. It must not leave
    // the group stuck: the group stays on device for this iteration
    // (correct as pushed), the old buffers go back, ordered after their
    // last copy, and the next iteration takes and retains new ones.
    std::string was, now;
    for (int64_t size : retained_sizes_) was += " " + std::to_string(size);
    for (int64_t size : sizes) now += " " + std::to_string(size);
    Status cleared = core_.pinned().Clear(pinned_tag_);
    retained_sizes_.clear();
    const std::string message =
        Where() + ": retain_pinned_buffers: the pinned buffers retained from "
        "an earlier iteration do not match the saved tensors' shapes (span "
        "bytes were [" + was + " ], now [" + now + " ]); tensor shapes must "
        "not change between iterations when retain_pinned_buffers is set";
    KeepOnDevice(message + (cleared.ok() ? "" : " (" + cleared.ToString() +
                                                    ")"));
    return InvalidArgumentError(
        message + ". The group stays on device in this iteration; the next "
        "iteration allocates and retains new pinned buffers");
  }

  // Pinned blocks first: without them the group stays on device. The D2H
  // stream waits until reused ones are no longer read by the last reload.
  const BlockLayout layout = PackByTag(sizes, tags);
  if (!sizes.empty()) {
    StatusOr<std::vector<Buffer>> hosts = core_.pinned().Take(
        layout.block_sizes, layout.block_tags, core_.d2h());
    if (!hosts.ok()) {
      int64_t total = 0;
      for (int64_t s : sizes) total += s;
      KeepOnDevice("pinned allocation of " + Bytes(total) + " failed (" +
                   hosts.status().ToString() + ")");
      return OkStatus();
    }
    host_ = std::move(hosts).value();
    host_tags_ = layout.block_tags;
    host_span_bytes_ = 0;
    for (int64_t size : sizes) host_span_bytes_ += size;
    if (retain_pinned) retained_sizes_ = sizes;
  }

  // Spans, then contiguous copies of sparse views as spans of their own
  // (in the order of `sizes`: span k lies in pinned block layout.block[k]).
  spans_.clear();
  auto place = [&](Span& span) {
    const size_t k = spans_.size();
    span.host_block = layout.block[k];
    span.host_offset = layout.offset[k];
  };
  for (const PlannedSpan& planned : plan.spans) {
    Span span;
    place(span);
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
      core_.Warn(Where() + ": tensor " + entries_[index].tensor.Describe() +
                 " covers " + Percent(plan.sparse_coverage[i]) +
                 " of the bytes it spans; not offloaded (skip_sparse_views)");
      continue;
    }
    Span span;  // a placeholder keeps host_ and spans_ aligned on failure
    place(span);
    if (MakeContiguous(index, plan.sparse_coverage[i])) {
      span.device = entries_[index].tensor.storage;
      span.bytes = entries_[index].tensor.nbytes();
      span.entries = {index};
      entries_[index].span = static_cast<int>(spans_.size());
      copied.push_back(index);
    }
    spans_.push_back(std::move(span));
  }
  state_ = GroupState::kOffloadStarted;
  Status copies = EnqueueOffloadCopies(!copied.empty());
  if (!copies.ok()) {
    // The device bytes are intact: keep the group there. Copies enqueued
    // before the failure may still read the device storages and the pinned
    // buffers: what frees them later is ordered after the D2H stream.
    copies_pending_ = true;
    Status released = ReleaseHost(retain_pinned);
    KeepOnDevice("enqueueing the offload failed (" + copies.ToString() +
                 (released.ok() ? "" : "; " + released.ToString()) + ")");
  }
  return OkStatus();
}

Status OffloadGroup::EnqueueOffloadCopies(bool gathered) {
  Stream& d2h = core_.d2h();
  if (gathered) {
    // Contiguous copies are ready once the compute stream reaches here.
    OFFLOAD_ASSIGN_OR_RETURN(Event * point, EnsureEvent(gathered_));
    OFFLOAD_RETURN_IF_ERROR(core_.compute().Record(*point));
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
        OFFLOAD_RETURN_IF_ERROR(d2h.Wait(*ready));
      }
    }
    if (latest != nullptr && latest->push_order > waited_push) {
      OFFLOAD_RETURN_IF_ERROR(d2h.Wait(*latest->ready));
      waited_push = latest->push_order;
    }
    if (needs_gathered) OFFLOAD_RETURN_IF_ERROR(d2h.Wait(*gathered_));
    host_last_user_ = &d2h;
    OFFLOAD_RETURN_IF_ERROR(d2h.Copy(
        HostData(span),
        static_cast<const char*>(span.device->data()) + span.begin,
        span.bytes));
    ++core_.stats().spans_offloaded;
    core_.stats().bytes_offloaded += span.bytes;
    copied_bytes_ += span.bytes;
  }
  OFFLOAD_ASSIGN_OR_RETURN(Event * done, EnsureEvent(offload_done_));
  return d2h.Record(*done);
}

Status OffloadGroup::ReleaseForwardMemory() {
  if (state_ == GroupState::kKeptOnDevice) return OkStatus();
  if (state_ != GroupState::kOffloadStarted) {
    return WrongState("ReleaseForwardMemory");
  }
  // Nothing may reuse the memory before the copies reading it are done.
  if (offload_done_ != nullptr) {
    OFFLOAD_RETURN_IF_ERROR(core_.compute().Wait(*offload_done_));
  }
  state_ = GroupState::kOffloadFinished;
  return DropDeviceStorages(/*ordered=*/true, OkStatus());
}

void* OffloadGroup::HostData(const Span& span) const {
  return static_cast<char*>(host_[span.host_block].data()) + span.host_offset;
}

void OffloadGroup::BeginIteration() {
  entries_.clear();
  spans_.clear();
  copies_pending_ = false;
  released_unordered_ = false;
  copied_bytes_ = 0;
  next_push_event_ = 0;
  state_ = GroupState::kNotOffloaded;
}

int64_t OffloadGroup::host_bytes() const {
  return host_.empty() ? 0 : host_span_bytes_;
}

}  // namespace offload
