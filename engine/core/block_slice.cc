#include "engine/core/block_slice.h"

namespace offload {

void* BlockSlice::data() const {
  if (block_ == nullptr) return nullptr;
  return static_cast<char*>(block_->data()) + offset_;
}

const Backend* BlockSlice::backend() const {
  return block_ == nullptr ? nullptr : block_->owner();
}

Status BlockSlice::ReleaseAfter(Stream& stream) {
  if (block_ == nullptr) {
    return FailedPreconditionError("ReleaseAfter: the slice was released");
  }
  Backend& owner = *block_->owner();
  Stream& home = *block_->stream();
  if (&stream != &home) {
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Event> point, owner.NewEvent());
    OFFLOAD_RETURN_IF_ERROR(stream.Record(*point));
    OFFLOAD_RETURN_IF_ERROR(home.Wait(*point));
  }
  if (block_.use_count() == 1) {
    OFFLOAD_RETURN_IF_ERROR(owner.Free(*block_, home));
  }
  block_.reset();
  return OkStatus();
}

}  // namespace offload
