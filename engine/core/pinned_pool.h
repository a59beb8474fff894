// PinnedPool: pinned host buffers kept for reuse across iterations (TE's
// retain_pinned_buffers, Megatron's pinned pool, SPEC §3.5, §5.5).
//
// A buffer is pooled under (bytes, tag): the layer mode tags a layer's
// buffers with its layer id, so that each layer gets its own back; the
// fine-grained mode tags them with the dtype. A returned buffer may be
// handed out again only after the copy that last used it has completed:
// the pool records that point as an event, and the next writer's stream
// waits for it (upstream Megatron hands a buffer back while its H2D copy
// still reads it: SPEC §5.8c).

#ifndef OFFLOAD_ENGINE_CORE_PINNED_POOL_H_
#define OFFLOAD_ENGINE_CORE_PINNED_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/offload_stats.h"
#include "engine/status.h"

namespace offload {

class PinnedPool {
 public:
  // `backend` and `stats` must outlive the pool.
  PinnedPool(Backend& backend, OffloaderStats& stats)
      : backend_(backend), stats_(stats) {}
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Buffers of `sizes` bytes (in order) under `tag`, all or none: pooled
  // ones of the same (bytes, tag) first, the rest newly allocated (counted
  // in stats.pinned_allocations). `writer` is made to wait until every
  // reused buffer's last copy has completed.
  // Errors: what AllocatePinned or Stream::Wait return; then nothing
  //   changed (new buffers, never used, are returned at once).
  StatusOr<std::vector<Buffer>> Take(const std::vector<int64_t>& sizes,
                                     int64_t tag, Stream& writer) {
    return Take(sizes, std::vector<int64_t>(sizes.size(), tag), writer);
  }
  // The same with a tag per buffer. REQUIRES: tags.size() == sizes.size().
  StatusOr<std::vector<Buffer>> Take(const std::vector<int64_t>& sizes,
                                     const std::vector<int64_t>& tags,
                                     Stream& writer);

  // Pools `buffers` under `tag`; each may be reused once the work enqueued
  // on `last_user` so far has completed.
  // Reuses an event of an earlier Give that no pooled buffer refers to.
  // Errors: what NewEvent or Record return. Then the buffers are not
  //   pooled but freed, ordered on `last_user`; if even that fails they
  //   are kept (never freed unordered) and counted in leaked_bytes().
  Status Give(std::vector<Buffer> buffers, int64_t tag, Stream& last_user) {
    std::vector<int64_t> tags(buffers.size(), tag);
    return Give(std::move(buffers), tags, last_user);
  }
  // The same with a tag per buffer. REQUIRES: tags.size() == buffers.size().
  Status Give(std::vector<Buffer> buffers, const std::vector<int64_t>& tags,
              Stream& last_user);

  // --- For a graph capture, which can neither allocate pinned memory nor
  // wait for work recorded outside it (SPEC §5.7). ---

  // Makes sure the pool holds a buffer of each (bytes, tag) of `blocks`,
  // counting multiplicity: allocates only what is missing (counted in
  // stats.pinned_allocations); the new buffers need no wait before use.
  // Errors: what AllocatePinned returns; the buffers allocated before the
  //   failure stay pooled.
  Status Reserve(const std::vector<std::pair<int64_t, int64_t>>& blocks);

  // Blocks the host until the last copy of every pooled buffer has
  // completed, then forgets those points: a later Take makes no stream wait.
  // Errors: what Event::Synchronize returns (the points not yet waited for
  //   are kept).
  Status Settle();

  // Forgets the reuse points of every pooled buffer without waiting for
  // them. REQUIRES: every later writer of a pooled buffer is ordered after
  // its last copy some other way (after a capture ended, its points were
  // recorded by work that never ran; its launches run whole on the compute
  // stream, which every copy of a later step waits for).
  void ForgetReusePoints();

  // Frees the pooled buffers of `tag`, each ordered on its last user's
  // stream. Errors: the first failed Free (that buffer is kept, counted in
  // leaked_bytes()).
  Status Clear(int64_t tag);

  // Frees every pooled buffer, ordered on its last user's stream.
  // Errors: the first failed Free (that buffer is kept, counted in
  //   leaked_bytes()); the others are freed.
  Status Clear();

  // Bytes pooled now.
  int64_t bytes() const;
  // Bytes that could be neither pooled nor freed in order.
  int64_t leaked_bytes() const;

 private:
  struct Pooled {
    Buffer buffer;
    int64_t tag = 0;
    Stream* last_user = nullptr;  // null: reserved, never used
    std::shared_ptr<Event> free_after;  // recorded on last_user; null: none
  };
  // The stream that last used a pooled buffer (the compute stream for a
  // reserved one never used).
  Stream& LastUser(const Pooled& pooled) const;
  // Frees `buffer` ordered on `stream`; keeps it on failure.
  Status FreeOrKeep(Buffer& buffer, Stream& stream);

  Backend& backend_;
  OffloaderStats& stats_;
  std::vector<Pooled> pooled_;
  std::vector<Buffer> leaked_;
  // Every event Give made, reused once no pooled buffer refers to it.
  std::vector<std::shared_ptr<Event>> events_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_PINNED_POOL_H_
