#include "engine/backend.h"

#include <string>
#include <utility>

namespace offload {

std::string_view MemorySpaceName(MemorySpace space) {
  switch (space) {
    case MemorySpace::kDevice:
      return "device";
    case MemorySpace::kPinnedHost:
      return "pinned";
  }
  return "unknown";
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      space_(other.space_),
      stream_(std::exchange(other.stream_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    space_ = other.space_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() { Reset(); }

void Buffer::Reset() {
  if (owner_ == nullptr) return;
  Backend* owner = std::exchange(owner_, nullptr);
  Status status = owner->Release(data_, size_, space_,
                                 space_ == MemorySpace::kDevice ? stream_
                                                                : nullptr);
  if (!status.ok()) owner->OnReleaseFailed(status);
  data_ = nullptr;
  size_ = 0;
  stream_ = nullptr;
}

Status Backend::Free(Buffer& buffer, Stream& stream) {
  if (buffer.empty()) {
    return InvalidArgumentError("Free: the buffer is empty (already freed or "
                                "moved from)");
  }
  if (buffer.owner() != this) {
    return InvalidArgumentError(
        "Free: the " + std::string(MemorySpaceName(buffer.space())) +
        " buffer of " + std::to_string(buffer.size()) +
        " bytes belongs to another backend");
  }
  if (!OwnsStream(stream)) {
    return InvalidArgumentError("Free: stream '" + std::string(stream.name()) +
                                "' belongs to another backend");
  }
  OFFLOAD_RETURN_IF_ERROR(
      Release(buffer.data(), buffer.size(), buffer.space(), &stream));
  buffer.owner_ = nullptr;  // released: the handle must not release again
  buffer.data_ = nullptr;
  buffer.size_ = 0;
  buffer.stream_ = nullptr;
  return OkStatus();
}

}  // namespace offload
