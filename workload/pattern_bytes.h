// Deterministic byte patterns for code that moves bytes around and checks
// where they landed (tests, the workload driver, the demo).
//
// Byte `i` of pattern `seed` is a mixing hash of (i, seed): the same
// arguments always give the same byte, two seeds differ in almost every
// byte, and a pattern has no short period, so bytes copied from the wrong
// source or to the wrong offset do not reproduce the expected pattern.

#ifndef OFFLOAD_WORKLOAD_PATTERN_BYTES_H_
#define OFFLOAD_WORKLOAD_PATTERN_BYTES_H_

#include <cstdint>
#include <vector>

namespace offload {

// Byte `index` (>= 0) of pattern `seed`.
uint8_t PatternByte(int64_t index, uint64_t seed);

// Bytes [begin, end) of pattern `seed` (empty when end <= begin).
std::vector<uint8_t> PatternBytes(int64_t begin, int64_t end, uint64_t seed);

// Writes bytes [first, first + size) of pattern `seed` to the host memory at
// `dst`.
void FillPattern(void* dst, int64_t size, uint64_t seed, int64_t first = 0);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_PATTERN_BYTES_H_
