// Byte helpers of the Backend conformance suite (backend_conformance.cc,
// graph_conformance.cc): pinned buffers holding a byte pattern, reading
// device bytes back, and gtest assertions on pinned bytes.

#ifndef OFFLOAD_TESTING_CONFORMANCE_BYTES_H_
#define OFFLOAD_TESTING_CONFORMANCE_BYTES_H_

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "gtest/gtest.h"

namespace offload {
namespace conformance {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;

// Writes pattern `seed` over the whole of `pinned` from the host.
void FillPinned(Buffer& pinned, uint64_t seed);

// A new pinned buffer of `size` bytes holding pattern `seed`.
StatusOr<Buffer> PinnedWithPattern(Backend& backend, int64_t size,
                                   uint64_t seed);

// Allocates a pinned buffer of `bytes` and enqueues on `stream` a copy of
// `bytes` from `device` into it. The caller synchronizes before reading.
StatusOr<Buffer> EnqueueReadBack(Backend& backend, Stream& stream,
                                 const void* device, int64_t bytes);

// Whether bytes [offset, offset + expected.size()) of the pinned buffer equal
// `expected`.
::testing::AssertionResult BytesAt(const Buffer& pinned, int64_t offset,
                                   const std::vector<uint8_t>& expected);

// Whether the whole pinned buffer holds pattern `seed`.
::testing::AssertionResult HoldsPattern(const Buffer& pinned, uint64_t seed);

// The address `offset` bytes into `buffer`.
char* At(const Buffer& buffer, int64_t offset);

}  // namespace conformance
}  // namespace offload

#endif  // OFFLOAD_TESTING_CONFORMANCE_BYTES_H_
