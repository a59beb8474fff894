#include "engine/core/offload_core.h"

#include <utility>

namespace offload {

OffloadCore::OffloadCore(Backend& backend, Stream& d2h, Stream& h2d,
                         const CoreOptions& options)
    : backend_(backend),
      compute_(backend.ComputeStream()),
      d2h_(d2h),
      h2d_(h2d),
      options_(options),
      diagnostics_(options.warnings_to_stderr),
      pinned_(backend, stats_) {}

OffloadCore::~OffloadCore() {
  Status retried = RetryKept();
  for (Kept& kept : kept_) {
    // No event orders the compute stream after the user: wait on the host.
    Status drained = kept.producer != nullptr ? kept.producer->Synchronize()
                                              : kept.user->Synchronize();
    if (!drained.ok()) {
      // Freeing now could race the copy: the memory is lost instead.
      Warn("~Offloader: " + std::to_string(kept.storage->size_bytes()) +
           " B are leaked: the streams that may still read them could not "
           "be drained (" + drained.ToString() + ")");
      new std::shared_ptr<Storage>(std::move(kept.storage));  // NOLINT
      continue;
    }
    if (kept.storage.use_count() == 1 &&
        !kept.storage->memory().HeldOutside()) {
      Status freed = kept.storage->memory().ReleaseAfter(compute_);
      if (!freed.ok()) {
        // Nothing reads it any more: dropping the last reference hands it
        // to its owner's destructor, which frees it.
        Warn("~Offloader: the owner of " +
             std::to_string(kept.storage->size_bytes()) +
             " B refused to release them (" + freed.ToString() +
             "); the streams have drained, so the engine drops its "
             "reference and the owner's destructor frees them");
      }
    }
    kept.storage.reset();  // others still holding it free it later
  }
  kept_.clear();
  Status cleared = pinned_.Clear();
  if (!cleared.ok()) Warn("~Offloader: " + cleared.ToString());
  if (!retried.ok()) Warn("~Offloader: " + retried.ToString());
}

Status OffloadCore::ComputeWaitsFor(Stream& user, Event& point) {
  if (&user == &compute_) return OkStatus();
  OFFLOAD_RETURN_IF_ERROR(user.Record(point));
  return compute_.Wait(point);
}

Status OffloadCore::FreeOnCompute(std::shared_ptr<Storage> storage,
                                  const std::function<std::string()>& what) {
  Status status = storage->memory().ReleaseAfter(compute_);
  if (!status.ok()) {
    Keep(std::move(storage), compute_, what(), status, KeepReason::kRefused);
  }
  return status;
}

Status OffloadCore::FreeOnCompute(std::shared_ptr<Storage> storage,
                                  const std::string& what) {
  return FreeOnCompute(std::move(storage),
                       std::function<std::string()>([&what] { return what; }));
}

void OffloadCore::Keep(std::shared_ptr<Storage> storage, Stream& user,
                       const std::string& what, const Status& why,
                       KeepReason reason) {
  const std::string bytes = std::to_string(storage->size_bytes());
  if (reason == KeepReason::kRefused) {
    Warn(what + ": " + bytes + " B of device memory are kept, not freed, "
         "because their owner refused the release after '" +
         std::string(user.name()) + "' (" + why.ToString() + ")");
  } else {
    Warn(what + ": " + bytes + " B of device memory are kept, not freed, "
         "because their free could not be ordered after the copies on '" +
         std::string(user.name()) + "' (" + why.ToString() + ")");
  }
  kept_.push_back(Kept{std::move(storage), &user, nullptr});
}

void OffloadCore::KeepUntil(std::shared_ptr<Storage> storage,
                            std::shared_ptr<Event> producer,
                            const std::string& what, const Status& why) {
  Warn(what + ": " + std::to_string(storage->size_bytes()) +
       " B of device memory are kept, not freed, because the compute "
       "stream could not be ordered after their producer's ready event (" +
       why.ToString() + ")");
  kept_.push_back(Kept{std::move(storage), nullptr, std::move(producer)});
}

Status OffloadCore::OrderKept(const Kept& kept) {
  if (kept.producer != nullptr) return compute_.Wait(*kept.producer);
  return ComputeWaitsFor(*kept.user, *retry_point_);
}

Status OffloadCore::RetryKept() {
  if (kept_.empty()) return OkStatus();
  if (retry_point_ == nullptr) {
    OFFLOAD_ASSIGN_OR_RETURN(retry_point_, backend_.NewEvent());
  }
  Status first = OkStatus();
  std::vector<Kept> still;
  for (Kept& kept : kept_) {
    Status status = OrderKept(kept);
    // Ordered now: free it if the core holds the last reference; otherwise
    // its last holder's free is ordered too.
    if (status.ok() && kept.storage.use_count() == 1 &&
        !kept.storage->memory().HeldOutside()) {
      status = kept.storage->memory().ReleaseAfter(compute_);
    }
    if (!status.ok()) {
      first.Update(status);
      still.push_back(std::move(kept));
    }
  }
  kept_ = std::move(still);
  return first;
}

int64_t OffloadCore::kept_bytes() const {
  int64_t total = pinned_.leaked_bytes();
  for (const Kept& kept : kept_) total += kept.storage->size_bytes();
  return total;
}

}  // namespace offload
