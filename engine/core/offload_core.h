// OffloadCore: what every offload group shares, owned by one front door.
//
// The mechanism of moving a group of saved tensors to pinned host memory and
// back (engine/core) is the same for TE's layer mode (engine/offload.h) and
// Megatron's fine-grained mode; only the policy of *when* differs. Each
// front door owns one OffloadCore: the backend and its compute stream, the
// D2H and H2D copy streams, the pinned pool, the statistics and the
// diagnostics sink, and the memory whose free could not be ordered. Groups
// (offload_group.h) are given the core once, at construction.

#ifndef OFFLOAD_ENGINE_CORE_OFFLOAD_CORE_H_
#define OFFLOAD_ENGINE_CORE_OFFLOAD_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/core/pinned_pool.h"
#include "engine/diagnostics.h"
#include "engine/offload_stats.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// How groups plan and copy (SPEC §2).
struct CoreOptions {
  // A storage's views are copied as one span when they cover at least this
  // fraction of the bytes they reach.
  double min_span_coverage = 0.5;
  // Sparser views are made contiguous on the compute stream, or with this
  // set left on device. Both warn.
  bool skip_sparse_views = false;
  bool warnings_to_stderr = false;
};

class OffloadCore {
 public:
  // Copies run on `d2h` and `h2d` (the same stream is allowed); they and
  // `backend` must outlive the core.
  OffloadCore(Backend& backend, Stream& d2h, Stream& h2d,
              const CoreOptions& options);
  // Returns the memory still kept (see Keep), each piece ordered after the
  // work that may use it; where no ordering call succeeds, blocks the host
  // until that stream is idle (the only host synchronization of the
  // engine, and only after an ordering call failed).
  ~OffloadCore();
  OffloadCore(const OffloadCore&) = delete;
  OffloadCore& operator=(const OffloadCore&) = delete;

  Backend& backend() const { return backend_; }
  Stream& compute() const { return compute_; }
  Stream& d2h() const { return d2h_; }
  Stream& h2d() const { return h2d_; }
  const CoreOptions& options() const { return options_; }
  PinnedPool& pinned() { return pinned_; }
  const PinnedPool& pinned() const { return pinned_; }
  OffloaderStats& stats() { return stats_; }
  const OffloaderStats& stats() const { return stats_; }
  Diagnostics& diagnostics() { return diagnostics_; }
  const Diagnostics& diagnostics() const { return diagnostics_; }
  void Warn(std::string message) { diagnostics_.Warn(std::move(message)); }

  // Makes the compute stream wait for everything enqueued on `user` so far
  // (recording `point` there). Errors: what Record or Wait return; then
  // the compute stream may not wait.
  Status ComputeWaitsFor(Stream& user, Event& point);

  // Frees `storage`'s memory on the compute stream now. REQUIRES: every
  // stream that used it is ordered before the compute stream's current end.
  // If the free fails the storage is kept (Keep) and the error returned.
  // `what` is called only if the free fails (no message on the hot path).
  Status FreeOnCompute(std::shared_ptr<Storage> storage,
                       const std::function<std::string()>& what);
  Status FreeOnCompute(std::shared_ptr<Storage> storage,
                       const std::string& what);

  // Why Keep holds memory, for its warning.
  enum class KeepReason {
    kUnordered,  // its free could not be ordered after the copies
    kRefused,    // its owner's ReleaseAfter failed
  };
  // Memory whose free could not be ordered after `user` (a copy stream
  // that may still read or write it), or whose owner refused to release
  // it: kept rather than freed unordered (a leak is better than a race),
  // with a warning naming `what` and the reason. RetryKept frees it once
  // ordered; the destructor, after draining `user`, frees it or, if its
  // owner refuses again, drops the reference (the owner's destructor frees
  // it).
  void Keep(std::shared_ptr<Storage> storage, Stream& user,
            const std::string& what, const Status& why,
            KeepReason reason = KeepReason::kUnordered);
  // The same for memory whose producer's ready point `producer` (an event
  // of another stream) the compute stream could not be made to wait for.
  void KeepUntil(std::shared_ptr<Storage> storage,
                 std::shared_ptr<Event> producer, const std::string& what,
                 const Status& why);

  // Frees what Keep holds, where the compute stream can now be ordered
  // after its user. Errors: the first ordering call that failed again (the
  // rest stays kept).
  Status RetryKept();

  // Bytes kept by Keep and by the pinned pool after failed frees.
  int64_t kept_bytes() const;

 private:
  struct Kept {
    std::shared_ptr<Storage> storage;
    Stream* user = nullptr;                 // order after this stream, or
    std::shared_ptr<Event> producer;        // after this event
  };
  // Orders the compute stream after what `kept` waits for.
  Status OrderKept(const Kept& kept);

  Backend& backend_;
  Stream& compute_;
  Stream& d2h_;
  Stream& h2d_;
  const CoreOptions options_;
  OffloaderStats stats_;
  Diagnostics diagnostics_;
  PinnedPool pinned_;
  std::vector<Kept> kept_;
  std::unique_ptr<Event> retry_point_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_OFFLOAD_CORE_H_
