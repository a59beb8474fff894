// Small helpers shared by the layer-stack benchmark's files: fatal errors,
// Status unwrapping, wall-clock timing, medians and output hashing. No CUDA.

#ifndef OFFLOAD_BENCH_BENCH_UTIL_H_
#define OFFLOAD_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace offload::bench {

// Prints "FATAL: <what>" to stderr and exits with status 1.
[[noreturn]] void Die(const std::string& what);

// Dies with `what` and the status when `s` is not OK.
void Must(const Status& s, const char* what);

// The value of `s`; dies with `what` and the status when it holds an error.
template <typename T>
T Must(StatusOr<T> s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.status().ToString());
  return std::move(s).value();
}

using Clock = std::chrono::steady_clock;

// Nanoseconds from `t0` to now.
double NsSince(Clock::time_point t0);

// The median of `v`; 0 when it is empty.
double Median(std::vector<double> v);

// A fast non-cryptographic 64-bit hash of `bytes` bytes at `data`, seeded by
// `h`. Used only to compare outputs between runs.
uint64_t HashBytes(const void* data, size_t bytes, uint64_t h = 0);

// Bytes to GiB (2^30 bytes).
double GiB(double b);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_BENCH_UTIL_H_
