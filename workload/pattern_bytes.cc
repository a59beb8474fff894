#include "workload/pattern_bytes.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace offload {

uint8_t PatternByte(int64_t index, uint64_t seed) {
  // splitmix64-style mixing of the index and the seed.
  uint64_t x = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull +
               (seed + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> 24);
}

std::vector<uint8_t> PatternBytes(int64_t begin, int64_t end, uint64_t seed) {
  std::vector<uint8_t> bytes;
  if (end <= begin) return bytes;
  bytes.resize(static_cast<size_t>(end - begin));
  FillPattern(bytes.data(), end - begin, seed, begin);
  return bytes;
}

void FillPattern(void* dst, int64_t size, uint64_t seed, int64_t first) {
  uint8_t* bytes = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < size; ++i) bytes[i] = PatternByte(first + i, seed);
}

}  // namespace offload
