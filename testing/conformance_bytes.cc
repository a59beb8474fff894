#include "testing/conformance_bytes.h"

#include <span>

#include "testing/byte_pattern.h"

namespace offload {
namespace conformance {

// Writes pattern `seed` over the whole of `pinned` from the host.
void FillPinned(Buffer& pinned, uint64_t seed) {
  FillPattern(pinned.data(), pinned.size(), seed);
}

// A new pinned buffer of `size` bytes holding pattern `seed`.
StatusOr<Buffer> PinnedWithPattern(Backend& backend, int64_t size,
                                   uint64_t seed) {
  OFFLOAD_ASSIGN_OR_RETURN(Buffer pinned, backend.AllocatePinned(size));
  FillPinned(pinned, seed);
  return pinned;
}

// Allocates a pinned buffer of `bytes` and enqueues on `stream` a copy of
// `bytes` from `device` into it. The caller synchronizes before reading.
StatusOr<Buffer> EnqueueReadBack(Backend& backend, Stream& stream,
                                 const void* device, int64_t bytes) {
  OFFLOAD_ASSIGN_OR_RETURN(Buffer pinned, backend.AllocatePinned(bytes));
  OFFLOAD_RETURN_IF_ERROR(stream.Copy(pinned.data(), device, bytes));
  return pinned;
}

// Whether bytes [offset, offset + expected.size()) of the pinned buffer equal
// `expected`.
::testing::AssertionResult BytesAt(const Buffer& pinned, int64_t offset,
                        const std::vector<uint8_t>& expected) {
  if (pinned.empty() || pinned.space() != MemorySpace::kPinnedHost) {
    return ::testing::AssertionFailure() << "not a live pinned buffer";
  }
  const int64_t length = static_cast<int64_t>(expected.size());
  if (offset < 0 || offset + length > pinned.size()) {
    return ::testing::AssertionFailure()
           << "range [" << offset << ", " << offset + length
           << ") is outside the " << pinned.size() << "-byte buffer";
  }
  const std::span<const uint8_t> actual(
      static_cast<const uint8_t*>(pinned.data()) + offset,
      static_cast<size_t>(length));
  ::testing::AssertionResult result = BytesEqual(actual, expected);
  if (!result) {
    result << " (indices count from byte " << offset << " of the "
           << pinned.size() << "-byte buffer)";
  }
  return result;
}

// Whether the whole pinned buffer holds pattern `seed`.
::testing::AssertionResult HoldsPattern(const Buffer& pinned, uint64_t seed) {
  return BytesAt(pinned, 0, PatternBytes(0, pinned.size(), seed));
}

char* At(const Buffer& buffer, int64_t offset) {
  return static_cast<char*>(buffer.data()) + offset;
}

}  // namespace conformance
}  // namespace offload
