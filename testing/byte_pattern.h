// Byte patterns for tests (workload/pattern_bytes.h, included here) and a
// gtest comparison of byte ranges.

#ifndef OFFLOAD_TESTING_BYTE_PATTERN_H_
#define OFFLOAD_TESTING_BYTE_PATTERN_H_

#include <cstdint>
#include <span>

#include "gtest/gtest.h"
#include "workload/pattern_bytes.h"

namespace offload {

// Succeeds when `actual` and `expected` have the same length and bytes. On
// failure the message gives the lengths, or the number of differing bytes
// and the first one (its index in the spans, got and wanted values).
::testing::AssertionResult BytesEqual(std::span<const uint8_t> actual,
                                      std::span<const uint8_t> expected);

}  // namespace offload

#endif  // OFFLOAD_TESTING_BYTE_PATTERN_H_
