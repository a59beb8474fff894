// OffloadGroup's backward side: StartReload (device blocks for the spans,
// the copies back on the H2D stream) and Pop, which hands a tensor back on
// its reloaded span (offload_group.h).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/block_slice.h"
#include "engine/core/offload_group.h"
#include "engine/core/offload_group_internal.h"

namespace offload {

using offload_group_internal::BlockLayout;
using offload_group_internal::Bytes;
using offload_group_internal::PackByTag;

Status OffloadGroup::StartReload() {
  if (state_ == GroupState::kKeptOnDevice) return OkStatus();
  if (state_ != GroupState::kOffloadFinished) return WrongState("StartReload");
  Backend& backend = core_.backend();
  Stream& compute = core_.compute();
  Stream& h2d = core_.h2d();
  // Device blocks for all spans (one unless a span's size breaks the
  // alignment), on the compute stream's pool: a failure leaves everything
  // as it was (nothing used the new memory, so freeing it on the compute
  // stream is ordered).
  std::vector<int64_t> sizes;
  std::vector<size_t> placed;  // the span of each entry of `sizes`
  for (size_t k = 0; k < spans_.size(); ++k) {
    if (spans_[k].bytes == 0) continue;  // placeholder
    sizes.push_back(spans_[k].bytes);
    placed.push_back(k);
  }
  // Under a graph capture, one block per span: CUDA's graph allocator
  // reuses a freed allocation only for a later one that fits in it and does
  // not merge neighbouring frees as the stream-ordered pool does, so one
  // group-sized block finds no room in the layer's separately freed
  // activations (measured on the H200: the graph then held one layer more
  // than the eager step, docs/graphs.md).
  std::vector<int64_t> block_tags(sizes.size(), 0);
  if (backend.IsCapturing(compute)) {
    for (size_t i = 0; i < block_tags.size(); ++i) block_tags[i] = int64_t(i);
  }
  const BlockLayout layout = PackByTag(sizes, block_tags);
  std::vector<std::shared_ptr<Buffer>> blocks;
  auto free_new = [&](Stream& stream) {
    Status first = OkStatus();
    for (auto& block : blocks) {
      if (!block->empty()) first.Update(backend.Free(*block, stream));
    }
    return first;
  };
  for (int64_t bytes : layout.block_sizes) {
    StatusOr<Buffer> allocated = backend.AllocateDevice(bytes, compute);
    if (!allocated.ok()) {
      Status freed = free_new(compute);
      return Status(allocated.status().code(),
                    "StartReload of " + Where() + ": " + Bytes(bytes) +
                        " of device memory for its spans (" +
                        allocated.status().message() +
                        "); the host copy is kept, retry when memory is free" +
                        (freed.ok() ? "" : " (" + freed.ToString() + ")"));
    }
    blocks.push_back(std::make_shared<Buffer>(std::move(allocated).value()));
  }
  // The span's reloaded bytes: entry i of `sizes`.
  auto device = [&](size_t i) {
    return static_cast<char*>(blocks[layout.block[i]]->data()) +
           layout.offset[i];
  };
  Status status = OkStatus();
  while (span_reloaded_.size() < spans_.size()) span_reloaded_.emplace_back();
  for (size_t k = 0; k < span_reloaded_.size() && status.ok(); ++k) {
    status = EnsureEvent(span_reloaded_[k]).status();
  }
  // The H2D stream may touch the new memory only after its allocation point.
  StatusOr<Event*> point = EnsureEvent(reload_point_);
  if (status.ok()) status = point.status();
  if (status.ok()) status = compute.Record(**point);
  if (status.ok()) status = h2d.Wait(**point);
  // SPEC §5.3: a reload waits for its own group's copies to host (the
  // compute stream, which the H2D stream just waited for, may not have).
  if (status.ok() && released_unordered_ && offload_done_ != nullptr) {
    status = h2d.Wait(*offload_done_);
  }
  if (!status.ok()) {
    // Nothing on the H2D stream uses the new memory yet.
    Status freed = free_new(compute);
    return Status(status.code(),
                  "StartReload of " + Where() + ": " + status.message() +
                      "; the host copy is kept, retry later" +
                      (freed.ok() ? "" : " (" + freed.ToString() + ")"));
  }
  // In span order on the one H2D stream: Pop relies on it (a span's event
  // covers the earlier spans' copies).
  for (size_t i = 0; i < placed.size() && status.ok(); ++i) {
    const size_t k = placed[i];
    host_last_user_ = &h2d;
    status = h2d.Copy(device(i), HostData(spans_[k]), spans_[k].bytes);
    if (status.ok()) status = h2d.Record(*span_reloaded_[k]);
  }
  if (!status.ok()) {
    // Free the new memory after whatever copies were enqueued (on the H2D
    // stream: the compute stream never used it); the host copy stays.
    Status freed = free_new(h2d);
    if (!freed.ok()) {
      for (auto& block : blocks) {
        if (block->empty()) continue;
        core_.Keep(std::make_shared<Storage>(std::move(*block)), h2d, Where(),
                   freed, OffloadCore::KeepReason::kRefused);
      }
    }
    return Status(status.code(), "StartReload of " + Where() + ": " +
                                     status.message() +
                                     "; the host copy is kept, retry later");
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    const size_t k = placed[i];
    spans_[k].reloaded = std::make_shared<Storage>(std::make_unique<BlockSlice>(
        blocks[layout.block[i]], layout.offset[i], spans_[k].bytes));
    spans_[k].waited = false;
    core_.stats().bytes_reloaded += spans_[k].bytes;
  }
  state_ = GroupState::kReloadStarted;
  return OkStatus();
}

StatusOr<Tensor> OffloadGroup::Pop(int index) {
  if (state_ == GroupState::kReleased) {
    return FailedPreconditionError(
        "Pop of tensor #" + std::to_string(index) + " of " + Where() +
        ": the group was released after its backward");
  }
  if (index < 0 || index >= static_cast<int>(entries_.size())) {
    return InvalidArgumentError("Pop of tensor #" + std::to_string(index) +
                                " of " + Where() +
                                ": no such tensor in the group");
  }
  const Entry& entry = entries_[index];
  if (state_ == GroupState::kOffloadFinished && entry.span >= 0) {
    return FailedPreconditionError(
        "Pop of tensor " + entry.tensor.Describe() + " of " + Where() +
        ": its device memory was released and its reload never started");
  }
  if (entry.span < 0 || state_ != GroupState::kReloadStarted) {
    return entry.tensor;  // still on device as pushed
  }
  Span& span = spans_[entry.span];
  if (!span.waited) {
    OFFLOAD_RETURN_IF_ERROR(
        core_.compute().Wait(*span_reloaded_[entry.span]));
    // StartReload enqueued the spans' copies in span order on the one H2D
    // stream: this span's event covers the copies of the spans before it,
    // so their pops need no wait of their own (none waits for more than
    // its own span: pops in reverse push order, as autograd's, wait once).
    for (int k = 0; k <= entry.span; ++k) spans_[k].waited = true;
  }
  Tensor tensor = entry.tensor;
  tensor.storage = span.reloaded;
  tensor.offset = (entry.byte_offset - span.begin) / tensor.element_size();
  tensor.ready = nullptr;
  return tensor;
}

}  // namespace offload
