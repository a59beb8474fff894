#include "engine/core/pinned_pool.h"

#include <algorithm>
#include <utility>

namespace offload {

StatusOr<std::vector<Buffer>> PinnedPool::Take(
    const std::vector<int64_t>& sizes, const std::vector<int64_t>& tags,
    Stream& writer) {
  std::vector<Buffer> out(sizes.size());
  std::vector<Pooled> reused;  // taken from pooled_, put back on failure
  Status status = OkStatus();
  for (size_t i = 0; i < sizes.size() && status.ok(); ++i) {
    auto it = std::find_if(pooled_.begin(), pooled_.end(), [&](const Pooled& p) {
      return p.tag == tags[i] && p.buffer.size() == sizes[i];
    });
    if (it != pooled_.end()) {
      reused.push_back(std::move(*it));
      pooled_.erase(it);
      continue;
    }
    StatusOr<Buffer> buffer = backend_.AllocatePinned(sizes[i]);
    if (!buffer.ok()) {
      status = buffer.status();
      break;
    }
    out[i] = std::move(buffer).value();
  }
  // The writer waits for the last use of every reused buffer (once per
  // event: buffers given back together share one).
  std::vector<Event*> waited;
  for (size_t i = 0; i < reused.size() && status.ok(); ++i) {
    Event* event = reused[i].free_after.get();
    if (event == nullptr ||
        std::find(waited.begin(), waited.end(), event) != waited.end()) {
      continue;
    }
    status = writer.Wait(*event);
    waited.push_back(event);
  }
  if (!status.ok()) {
    // Nothing used the new buffers: dropping them frees them at once.
    for (Pooled& p : reused) pooled_.push_back(std::move(p));
    return status;
  }
  for (Buffer& buffer : out) {
    if (!buffer.empty()) ++stats_.pinned_allocations;
  }
  // Fill the gaps with the reused buffers, matching sizes and tags in order.
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!out[i].empty()) continue;
    auto it = std::find_if(reused.begin(), reused.end(), [&](const Pooled& p) {
      return !p.buffer.empty() && p.buffer.size() == sizes[i] &&
             p.tag == tags[i];
    });
    out[i] = std::move(it->buffer);
  }
  return out;
}

Stream& PinnedPool::LastUser(const Pooled& pooled) const {
  // A reserved buffer no copy used yet: any stream orders its free.
  return pooled.last_user != nullptr ? *pooled.last_user
                                     : backend_.ComputeStream();
}

Status PinnedPool::FreeOrKeep(Buffer& buffer, Stream& stream) {
  Status status = backend_.Free(buffer, stream);
  if (!status.ok()) leaked_.push_back(std::move(buffer));
  return status;
}

Status PinnedPool::Give(std::vector<Buffer> buffers,
                        const std::vector<int64_t>& tags, Stream& last_user) {
  if (buffers.empty()) return OkStatus();
  // An event no pooled buffer refers to any more is recorded again (a
  // wait made on it earlier keeps what it waited for).
  std::shared_ptr<Event> free_after;
  for (const std::shared_ptr<Event>& event : events_) {
    if (event.use_count() == 1) free_after = event;
  }
  Status status = OkStatus();
  if (free_after == nullptr) {
    StatusOr<std::unique_ptr<Event>> event = backend_.NewEvent();
    status = event.status();
    if (status.ok()) {
      free_after = std::move(event).value();
      events_.push_back(free_after);
    }
  }
  if (status.ok()) status = last_user.Record(*free_after);
  if (!status.ok()) {
    // No point to wait for: free them in stream order instead.
    // A failed free keeps the buffer (leaked_bytes); the first error wins.
    for (Buffer& buffer : buffers) {
      Status freed = FreeOrKeep(buffer, last_user);
      if (!freed.ok()) status = status.WithContext(freed.ToString());
    }
    return status;
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    pooled_.push_back(
        Pooled{std::move(buffers[i]), tags[i], &last_user, free_after});
  }
  return OkStatus();
}

Status PinnedPool::Reserve(
    const std::vector<std::pair<int64_t, int64_t>>& blocks) {
  std::vector<bool> claimed(pooled_.size(), false);
  for (const auto& [bytes, tag] : blocks) {
    bool found = false;
    for (size_t i = 0; i < pooled_.size() && !found; ++i) {
      if (!claimed[i] && pooled_[i].tag == tag &&
          pooled_[i].buffer.size() == bytes) {
        claimed[i] = found = true;
      }
    }
    if (found) continue;
    OFFLOAD_ASSIGN_OR_RETURN(Buffer buffer, backend_.AllocatePinned(bytes));
    ++stats_.pinned_allocations;
    pooled_.push_back(Pooled{std::move(buffer), tag, nullptr, nullptr});
    claimed.push_back(true);
  }
  return OkStatus();
}

Status PinnedPool::Settle() {
  for (Pooled& p : pooled_) {
    if (p.free_after == nullptr) continue;
    OFFLOAD_RETURN_IF_ERROR(p.free_after->Synchronize());
    p.free_after = nullptr;
  }
  return OkStatus();
}

void PinnedPool::ForgetReusePoints() {
  for (Pooled& p : pooled_) p.free_after = nullptr;
}

Status PinnedPool::Clear() {
  Status first = OkStatus();
  for (Pooled& p : pooled_) {
    first.Update(FreeOrKeep(p.buffer, LastUser(p)));
  }
  pooled_.clear();
  return first;
}

Status PinnedPool::Clear(int64_t tag) {
  Status first = OkStatus();
  std::vector<Pooled> kept;
  for (Pooled& p : pooled_) {
    if (p.tag != tag) {
      kept.push_back(std::move(p));
      continue;
    }
    first.Update(FreeOrKeep(p.buffer, LastUser(p)));
  }
  pooled_ = std::move(kept);
  return first;
}

int64_t PinnedPool::bytes() const {
  int64_t total = 0;
  for (const Pooled& p : pooled_) total += p.buffer.size();
  return total;
}

int64_t PinnedPool::leaked_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : leaked_) total += b.size();
  return total;
}

}  // namespace offload
