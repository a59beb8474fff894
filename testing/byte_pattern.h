// Deterministic byte patterns for tests that move bytes around and check
// where they landed.
//
// Byte `i` of pattern `seed` is a mixing hash of (i, seed): the same
// arguments always give the same byte, two seeds differ in almost every
// byte, and a pattern has no short period, so bytes copied from the wrong
// source or to the wrong offset do not reproduce the expected pattern.

#ifndef OFFLOAD_TESTING_BYTE_PATTERN_H_
#define OFFLOAD_TESTING_BYTE_PATTERN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "gtest/gtest.h"

namespace offload {

// Byte `index` (>= 0) of pattern `seed`.
uint8_t PatternByte(int64_t index, uint64_t seed);

// Bytes [begin, end) of pattern `seed` (empty when end <= begin).
std::vector<uint8_t> PatternBytes(int64_t begin, int64_t end, uint64_t seed);

// Writes bytes [first, first + size) of pattern `seed` to the host memory at
// `dst`.
void FillPattern(void* dst, int64_t size, uint64_t seed, int64_t first = 0);

// Succeeds when `actual` and `expected` have the same length and bytes. On
// failure the message gives the lengths, or the number of differing bytes
// and the first one (its index in the spans, got and wanted values).
::testing::AssertionResult BytesEqual(std::span<const uint8_t> actual,
                                      std::span<const uint8_t> expected);

}  // namespace offload

#endif  // OFFLOAD_TESTING_BYTE_PATTERN_H_
