#include "testing/byte_pattern.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using ::testing::HasSubstr;

TEST(BytePatternTest, IsDeterministic) {
  EXPECT_EQ(PatternBytes(0, 4096, 7), PatternBytes(0, 4096, 7));
  EXPECT_EQ(PatternByte(12345, 3), PatternByte(12345, 3));
}

TEST(BytePatternTest, SeedsDifferInAlmostEveryByte) {
  const std::vector<uint8_t> a = PatternBytes(0, 1 << 16, 1);
  const std::vector<uint8_t> b = PatternBytes(0, 1 << 16, 2);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, (1 << 16) / 64);  // ~1/256 expected by chance
}

TEST(BytePatternTest, ShiftedPatternDoesNotMatch) {
  const std::vector<uint8_t> base = PatternBytes(0, 8192, 5);
  for (int shift : {1, 256, 4096}) {
    const std::vector<uint8_t> shifted = PatternBytes(shift, shift + 8192, 5);
    EXPECT_FALSE(BytesEqual(shifted, base)) << "shift " << shift;
  }
}

TEST(BytePatternTest, SlicesAndFillsAgree) {
  const std::vector<uint8_t> whole = PatternBytes(0, 1000, 9);
  const std::vector<uint8_t> slice = PatternBytes(100, 300, 9);
  EXPECT_TRUE(BytesEqual(
      slice, std::vector<uint8_t>(whole.begin() + 100, whole.begin() + 300)));
  std::vector<uint8_t> filled(200);
  FillPattern(filled.data(), 200, 9, /*first=*/100);
  EXPECT_EQ(filled, slice);
  EXPECT_TRUE(PatternBytes(5, 5, 9).empty());
  EXPECT_TRUE(PatternBytes(6, 5, 9).empty());
}

TEST(BytesEqualTest, ReportsTheFirstDifference) {
  std::vector<uint8_t> actual = {1, 2, 3, 4};
  const std::vector<uint8_t> expected = {1, 2, 9, 8};
  const ::testing::AssertionResult result = BytesEqual(actual, expected);
  EXPECT_FALSE(result);
  EXPECT_THAT(result.message(),
              HasSubstr("2 of 4 bytes differ; the first at index 2: got 3, "
                        "want 9"));
  EXPECT_THAT(BytesEqual(actual, std::vector<uint8_t>{1, 2}).message(),
              HasSubstr("got 4 bytes, want 2"));
  EXPECT_TRUE(BytesEqual(actual, actual));
}

}  // namespace
}  // namespace offload
