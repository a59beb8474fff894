// Pinned copy bandwidth with raw cudaMemcpyAsync (GB/s = 1e9 B/s): the peak
// the simulated schedule and the limit assume for the engine's copies.

#ifndef OFFLOAD_BENCH_PINNED_BANDWIDTH_H_
#define OFFLOAD_BENCH_PINNED_BANDWIDTH_H_

#include <cstddef>

namespace offload::bench {

struct Bandwidth {
  double d2h = 0, h2d = 0, both_d2h = 0, both_h2d = 0;
};

// Copies `chunk` bytes back to back between one device buffer and one pinned
// buffer until about `total` bytes have moved, D2H alone, H2D alone and both
// at once on two streams; the median of 3 repetitions each, after a warm-up.
Bandwidth MeasurePinned(size_t chunk, size_t total);

// The bandwidth at the sizes the layer stack copies: 16 MiB, one [T,H] bf16
// activation (`span_small` bytes) and 256 MiB.
struct PinnedPeak {
  size_t span_small = 0;
  Bandwidth small, mib16, big;
  // The best of the three, one direction alone.
  double d2h() const;
  double h2d() const;
};

// Measures `span_small`, then 16 MiB, then 256 MiB.
PinnedPeak MeasurePinnedPeak(size_t span_small);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_PINNED_BANDWIDTH_H_
