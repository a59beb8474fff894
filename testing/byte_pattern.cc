#include "testing/byte_pattern.h"

#include <cstdint>
#include <span>

#include "gtest/gtest.h"

namespace offload {

::testing::AssertionResult BytesEqual(std::span<const uint8_t> actual,
                                      std::span<const uint8_t> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "got " << actual.size() << " bytes, want " << expected.size();
  }
  size_t mismatches = 0;
  size_t first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) {
      if (mismatches == 0) first = i;
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << actual.size()
         << " bytes differ; the first at index " << first << ": got "
         << static_cast<int>(actual[first]) << ", want "
         << static_cast<int>(expected[first]);
}

}  // namespace offload
