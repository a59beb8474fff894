#include "bench/bench_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace offload::bench {

void Die(const std::string& what) {
  std::fprintf(stderr, "FATAL: %s\n", what.c_str());
  std::exit(1);
}

void Must(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

double NsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t HashBytes(const void* data, size_t bytes, uint64_t h) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4] = {h ^ 0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full,
                      0x165667B19E3779F9ull, 0x27D4EB2F165667C5ull};
  size_t words = bytes / 8;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    for (int j = 0; j < 4; ++j) {
      lane[j] = (lane[j] ^ w[i + j]) * 0x100000001B3ull;
      lane[j] ^= lane[j] >> 29;
    }
  }
  uint64_t r = lane[0] ^ (lane[1] * 3) ^ (lane[2] * 5) ^ (lane[3] * 7);
  for (; i < words; ++i) r = (r ^ w[i]) * 0x100000001B3ull;
  for (size_t b = words * 8; b < bytes; ++b) r = (r ^ p[b]) * 0x100000001B3ull;
  return r;
}

double GiB(double b) { return b / double(int64_t{1} << 30); }

}  // namespace offload::bench
