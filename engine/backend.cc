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

void ForEachContiguousRun(
    int64_t element_size, const std::vector<int64_t>& shape,
    const std::vector<int64_t>& strides,
    const std::function<void(int64_t, int64_t, int64_t)>& run) {
  for (int64_t size : shape) {
    if (size == 0) return;
  }
  // Fold trailing dimensions that are dense into one run.
  int64_t run_elements = 1;
  size_t outer = shape.size();
  while (outer > 0 &&
         (shape[outer - 1] == 1 || strides[outer - 1] == run_elements)) {
    run_elements *= shape[outer - 1];
    --outer;
  }
  const int64_t run_bytes = run_elements * element_size;
  std::vector<int64_t> index(outer, 0);
  int64_t dst = 0;
  for (;;) {
    int64_t src = 0;
    for (size_t d = 0; d < outer; ++d) src += index[d] * strides[d];
    run(src * element_size, dst, run_bytes);
    dst += run_bytes;
    // Odometer increment over the outer dimensions.
    size_t d = outer;
    while (d > 0) {
      if (++index[d - 1] < shape[d - 1]) break;
      index[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

Status Stream::Gather(void* dst, const void* src, int64_t element_size,
                      const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) {
  OFFLOAD_RETURN_IF_ERROR(
      ValidateGather(name(), dst, src, element_size, shape, strides));
  Status status;
  ForEachContiguousRun(
      element_size, shape, strides,
      [&](int64_t src_offset, int64_t dst_offset, int64_t bytes) {
        if (!status.ok()) return;
        status = Copy(static_cast<char*>(dst) + dst_offset,
                      static_cast<const char*>(src) + src_offset, bytes);
      });
  return status;
}

Status ValidateGather(std::string_view stream, const void* dst,
                      const void* src, int64_t element_size,
                      const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) {
  std::string where = "Gather on stream '" + std::string(stream) + "': ";
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError(where + "null source or destination");
  }
  if (element_size <= 0) {
    return InvalidArgumentError(where + "element size must be positive");
  }
  if (shape.size() != strides.size()) {
    return InvalidArgumentError(where + "shape and strides differ in length");
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) {
      return InvalidArgumentError(where + "negative size or stride");
    }
  }
  return OkStatus();
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

std::string_view CaptureModeName(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal:
      return "global";
    case CaptureMode::kThreadLocal:
      return "thread_local";
    case CaptureMode::kRelaxed:
      return "relaxed";
  }
  return "unknown";
}

namespace {

Status NoGraphs(std::string_view call) {
  return UnimplementedError(std::string(call) +
                            ": this backend does not support graph capture");
}

}  // namespace

Status Backend::BeginCapture(Stream& /*stream*/, CaptureMode /*mode*/) {
  return NoGraphs("BeginCapture");
}

StatusOr<std::unique_ptr<Graph>> Backend::EndCapture(Stream& /*stream*/) {
  return NoGraphs("EndCapture");
}

StatusOr<std::unique_ptr<GraphExec>> Backend::Instantiate(
    const Graph& /*graph*/) {
  return NoGraphs("Instantiate");
}

Status Backend::Launch(GraphExec& /*exec*/, Stream& /*stream*/) {
  return NoGraphs("Launch");
}

}  // namespace offload
