// Copy bandwidth through the Backend interface next to raw cudaMemcpyAsync.
//
// For each size (64 KiB, 1 MiB, 16 MiB, 256 MiB) and direction (D2H alone,
// H2D alone, both at once on two streams) it enqueues back-to-back copies
// between one device buffer and one pinned buffer and measures, for:
//   raw      cudaMemcpyAsync on two non-blocking streams, memory from
//            cudaMalloc / cudaHostAlloc;
//   backend  Stream::Copy of a CudaBackend on two of its streams, memory from
//            its pools;
//   +alloc   as backend, but every copy also allocates its destination
//            (pinned for D2H, device for H2D) and frees it stream-ordered, as
//            the offload engine does.
// A measurement enqueues `count` copies per direction (about 1 GiB each, at
// least 8), then polls an event per direction until both completed; GB/s is
// bytes / (completion time - start) per direction (GB = 1e9 bytes). Each
// figure is the median of the repetitions, and the implementations take turns
// within a repetition. "us/call" is the host time spent enqueueing, per copy;
// for +alloc D2H the mean (max) host time of AllocatePinned, Copy and Free is
// shown too. Before measuring, +alloc is repeated until the pools stop
// growing, and any growth while measuring is reported.
//
// After the table: the cost of cudaHostAlloc for one slab, D2H variants that
// separate the effects of distinct destinations, event records and pool calls
// (1 MiB and 16 MiB), and the host cost of Copy's range check.
//
// Usage: cuda_copy_benchmark [--quick] [--reps N] [--out FILE.md]
//   --quick: 64 KiB and 1 MiB, 16 MiB per measurement, one repetition (for
//   compute-sanitizer).

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "engine/backend.h"
#include "engine/status.h"

namespace offload {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cuda_copy_benchmark: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t error, const char* call) {
  if (error != cudaSuccess) {
    Die(std::string(call) + ": " + cudaGetErrorName(error) + ": " +
        cudaGetErrorString(error));
  }
}

void Check(const Status& status) {
  if (!status.ok()) Die(status.ToString());
}

template <typename T>
T Take(StatusOr<T> value) {
  Check(value.status());
  return std::move(value).value();
}

enum class Direction { kD2H, kH2D, kBoth };
enum class Impl { kRaw, kBackend, kBackendAlloc };
constexpr Impl kImpls[] = {Impl::kRaw, Impl::kBackend, Impl::kBackendAlloc};

const char* DirectionName(Direction d) {
  switch (d) {
    case Direction::kD2H:
      return "D2H";
    case Direction::kH2D:
      return "H2D";
    case Direction::kBoth:
      return "both";
  }
  return "?";
}

std::string SizeName(int64_t bytes) {
  if (bytes >= kMiB) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes / kKiB) + " KiB";
}

struct Sample {
  double d2h_gbps = 0;  // 0 when the direction was not measured
  double h2d_gbps = 0;
  double enqueue_us_per_copy = 0;
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The figures of a run of `count` copies of `bytes` in each measured
// direction, started at `start`, all enqueued by `enqueued`.
Sample BothDirections(int64_t bytes, int64_t count, bool d2h, bool h2d,
                      Clock::time_point start, Clock::time_point enqueued,
                      Clock::time_point d2h_end, Clock::time_point h2d_end) {
  const double total = static_cast<double>(bytes) * count;
  Sample sample;
  if (d2h) sample.d2h_gbps = total / Seconds(d2h_end - start) / 1e9;
  if (h2d) sample.h2d_gbps = total / Seconds(h2d_end - start) / 1e9;
  sample.enqueue_us_per_copy = Seconds(enqueued - start) * 1e6 /
                               static_cast<double>(count * (d2h + h2d));
  return sample;
}

// Raw CUDA: its own streams, events and memory.
class Raw {
 public:
  explicit Raw(int64_t max_bytes) {
    Check(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    Check(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    Check(cudaEventCreateWithFlags(&d2h_done_, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    Check(cudaEventCreateWithFlags(&h2d_done_, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    Check(cudaMalloc(&dev_src_, max_bytes), "cudaMalloc");
    Check(cudaMalloc(&dev_dst_, max_bytes), "cudaMalloc");
    Check(cudaHostAlloc(&host_src_, max_bytes, cudaHostAllocDefault),
          "cudaHostAlloc");
    Check(cudaHostAlloc(&host_dst_, max_bytes, cudaHostAllocDefault),
          "cudaHostAlloc");
    std::memset(host_src_, 0x5a, max_bytes);
    Check(cudaMemset(dev_src_, 0xa5, max_bytes), "cudaMemset");
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // D2H alone into `count` consecutive pieces of one cudaHostAlloc buffer
  // (distinct destinations, like a pool's pieces), for the diagnostics.
  Sample RunD2HRing(int64_t bytes, int64_t count) {
    if (ring_bytes_ < bytes * count) {
      if (ring_ != nullptr) Check(cudaFreeHost(ring_), "cudaFreeHost");
      ring_bytes_ = bytes * count;
      Check(cudaHostAlloc(&ring_, ring_bytes_, cudaHostAllocDefault),
            "cudaHostAlloc");
    }
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      Check(cudaMemcpyAsync(static_cast<char*>(ring_) + i * bytes, dev_src_,
                            bytes, cudaMemcpyDefault, d2h_),
            "cudaMemcpyAsync");
    }
    Check(cudaEventRecord(d2h_done_, d2h_), "cudaEventRecord");
    const Clock::time_point enqueued = Clock::now();
    while (!Done(d2h_done_)) {
    }
    const Clock::time_point end = Clock::now();
    Sample sample;
    sample.d2h_gbps = static_cast<double>(bytes) * count /
                      Seconds(end - start) / 1e9;
    sample.enqueue_us_per_copy = Seconds(enqueued - start) * 1e6 / count;
    return sample;
  }

  ~Raw() {
    if (ring_ != nullptr) cudaFreeHost(ring_);
    cudaFree(dev_src_);
    cudaFree(dev_dst_);
    cudaFreeHost(host_src_);
    cudaFreeHost(host_dst_);
    cudaEventDestroy(d2h_done_);
    cudaEventDestroy(h2d_done_);
    cudaStreamDestroy(d2h_);
    cudaStreamDestroy(h2d_);
  }

  Sample Run(Direction dir, int64_t bytes, int64_t count) {
    const bool d2h = dir != Direction::kH2D, h2d = dir != Direction::kD2H;
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      if (d2h) {
        Check(cudaMemcpyAsync(host_dst_, dev_src_, bytes, cudaMemcpyDefault,
                              d2h_),
              "cudaMemcpyAsync");
      }
      if (h2d) {
        Check(cudaMemcpyAsync(dev_dst_, host_src_, bytes, cudaMemcpyDefault,
                              h2d_),
              "cudaMemcpyAsync");
      }
    }
    if (d2h) Check(cudaEventRecord(d2h_done_, d2h_), "cudaEventRecord");
    if (h2d) Check(cudaEventRecord(h2d_done_, h2d_), "cudaEventRecord");
    const Clock::time_point enqueued = Clock::now();
    Clock::time_point d2h_end = start, h2d_end = start;
    bool d2h_pending = d2h, h2d_pending = h2d;
    while (d2h_pending || h2d_pending) {
      if (d2h_pending && Done(d2h_done_)) {
        d2h_end = Clock::now();
        d2h_pending = false;
      }
      if (h2d_pending && Done(h2d_done_)) {
        h2d_end = Clock::now();
        h2d_pending = false;
      }
    }
    Sample sample = BothDirections(bytes, count, d2h, h2d, start, enqueued,
                                   d2h_end, h2d_end);
    return sample;
  }

 private:
  static bool Done(cudaEvent_t event) {
    const cudaError_t error = cudaEventQuery(event);
    if (error == cudaErrorNotReady) return false;
    Check(error, "cudaEventQuery");
    return true;
  }

  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  cudaEvent_t d2h_done_ = nullptr, h2d_done_ = nullptr;
  void* dev_src_ = nullptr;
  void* dev_dst_ = nullptr;
  void* host_src_ = nullptr;
  void* host_dst_ = nullptr;
  void* ring_ = nullptr;
  int64_t ring_bytes_ = 0;
};

// Host time per kind of call in a +alloc D2H run (diagnostics).
struct CallTimes {
  double alloc_us = 0, copy_us = 0, free_us = 0;  // mean per copy
  double max_alloc_us = 0, max_copy_us = 0, max_free_us = 0;
};

enum class D2HVariant {
  kFixed,         // one destination buffer
  kRing,          // `count` pinned buffers allocated beforehand
  kFixedRecord,   // one destination, and an event recorded after each copy
  kAllocTimed,    // +alloc, with each call timed
};

// The same through the Backend interface.
class ThroughBackend {
 public:
  ThroughBackend(int64_t max_bytes, const CudaOptions& options)
      : backend_(Take(NewCudaBackend(options))) {
    d2h_ = Take(backend_->NewStream("d2h"));
    h2d_ = Take(backend_->NewStream("h2d"));
    d2h_done_ = Take(backend_->NewEvent());
    h2d_done_ = Take(backend_->NewEvent());
    Stream& compute = backend_->ComputeStream();
    dev_src_ = Take(backend_->AllocateDevice(max_bytes, compute));
    dev_dst_ = Take(backend_->AllocateDevice(max_bytes, compute));
    host_src_ = Take(backend_->AllocatePinned(max_bytes));
    host_dst_ = Take(backend_->AllocatePinned(max_bytes));
    std::memset(host_src_.data(), 0x5a, max_bytes);
    Check(compute.Copy(dev_src_.data(), host_src_.data(), max_bytes));
    Check(compute.Synchronize());
    // The copy streams use memory allocated on compute: ordered by the
    // synchronization above.
  }
  ~ThroughBackend() {
    Check(d2h_->Synchronize());
    Check(h2d_->Synchronize());
    Check(backend_->ComputeStream().Synchronize());
  }

  CudaBackend& backend() { return *backend_; }

  // D2H alone in one of the diagnostic variants.
  Sample RunD2H(D2HVariant variant, int64_t bytes, int64_t count,
                CallTimes* times) {
    std::vector<Buffer> ring;
    if (variant == D2HVariant::kRing) {
      for (int64_t i = 0; i < count; ++i) {
        ring.push_back(Take(backend_->AllocatePinned(bytes)));
      }
    }
    CallTimes t;
    auto timed = [](double* sum, double* max, Clock::time_point a) {
      const double us = Seconds(Clock::now() - a) * 1e6;
      *sum += us;
      *max = std::max(*max, us);
    };
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      switch (variant) {
        case D2HVariant::kFixed:
          Check(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes));
          break;
        case D2HVariant::kRing:
          Check(d2h_->Copy(ring[i].data(), dev_src_.data(), bytes));
          break;
        case D2HVariant::kFixedRecord:
          Check(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes));
          Check(d2h_->Record(*h2d_done_));
          break;
        case D2HVariant::kAllocTimed: {
          Clock::time_point a = Clock::now();
          Buffer host = Take(backend_->AllocatePinned(bytes));
          timed(&t.alloc_us, &t.max_alloc_us, a);
          a = Clock::now();
          Check(d2h_->Copy(host.data(), dev_src_.data(), bytes));
          timed(&t.copy_us, &t.max_copy_us, a);
          a = Clock::now();
          Check(backend_->Free(host, *d2h_));
          timed(&t.free_us, &t.max_free_us, a);
          break;
        }
      }
    }
    Check(d2h_->Record(*d2h_done_));
    const Clock::time_point enqueued = Clock::now();
    while (!Take(d2h_done_->Query())) {
    }
    const Clock::time_point end = Clock::now();
    Sample sample;
    sample.d2h_gbps = static_cast<double>(bytes) * count /
                      Seconds(end - start) / 1e9;
    sample.enqueue_us_per_copy = Seconds(enqueued - start) * 1e6 / count;
    if (times != nullptr) {
      t.alloc_us /= count;
      t.copy_us /= count;
      t.free_us /= count;
      *times = t;
    }
    return sample;
  }

  // Host time of each call in the last +alloc run's D2H side.
  const CallTimes& last_times() const { return last_times_; }

  Sample Run(Direction dir, int64_t bytes, int64_t count, bool allocate) {
    const bool d2h = dir != Direction::kH2D, h2d = dir != Direction::kD2H;
    CallTimes t;
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      if (d2h) {
        if (allocate) {
          Clock::time_point a = Clock::now();
          Buffer host = Take(backend_->AllocatePinned(bytes));
          Timed(&t.alloc_us, &t.max_alloc_us, a);
          a = Clock::now();
          Check(d2h_->Copy(host.data(), dev_src_.data(), bytes));
          Timed(&t.copy_us, &t.max_copy_us, a);
          a = Clock::now();
          Check(backend_->Free(host, *d2h_));
          Timed(&t.free_us, &t.max_free_us, a);
        } else {
          Check(d2h_->Copy(host_dst_.data(), dev_src_.data(), bytes));
        }
      }
      if (h2d) {
        if (allocate) {
          Buffer device = Take(backend_->AllocateDevice(bytes, *h2d_));
          Check(h2d_->Copy(device.data(), host_src_.data(), bytes));
          Check(backend_->Free(device, *h2d_));
        } else {
          Check(h2d_->Copy(dev_dst_.data(), host_src_.data(), bytes));
        }
      }
    }
    if (d2h) Check(d2h_->Record(*d2h_done_));
    if (h2d) Check(h2d_->Record(*h2d_done_));
    const Clock::time_point enqueued = Clock::now();
    Clock::time_point d2h_end = start, h2d_end = start;
    bool d2h_pending = d2h, h2d_pending = h2d;
    while (d2h_pending || h2d_pending) {
      if (d2h_pending && Take(d2h_done_->Query())) {
        d2h_end = Clock::now();
        d2h_pending = false;
      }
      if (h2d_pending && Take(h2d_done_->Query())) {
        h2d_end = Clock::now();
        h2d_pending = false;
      }
    }
    Sample sample = BothDirections(bytes, count, d2h, h2d, start, enqueued,
                                   d2h_end, h2d_end);
    if (allocate && d2h) {
      t.alloc_us /= count;
      t.copy_us /= count;
      t.free_us /= count;
      last_times_ = t;
    }
    return sample;
  }

 private:
  static double Timed(double* sum, double* max, Clock::time_point since) {
    const double us = Seconds(Clock::now() - since) * 1e6;
    *sum += us;
    *max = std::max(*max, us);
    return us;
  }

  CallTimes last_times_;
  std::unique_ptr<CudaBackend> backend_;
  Stream* d2h_ = nullptr;
  Stream* h2d_ = nullptr;
  std::unique_ptr<Event> d2h_done_, h2d_done_;
  Buffer dev_src_, dev_dst_, host_src_, host_dst_;
};

struct Row {
  int64_t bytes;
  Direction dir;
  bool d2h_side;  // which direction's figure this row shows
  double gbps[3];
  double us_per_copy[3];
  CallTimes alloc_times;  // +alloc D2H calls, last repetition
};

int Main(int argc, char** argv) {
  bool quick = false;
  int reps = 5;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      Die("unknown argument " + arg +
          " (usage: [--quick] [--reps N] [--out FILE.md])");
    }
  }
  std::vector<int64_t> sizes = {64 * kKiB, 1 * kMiB, 16 * kMiB, 256 * kMiB};
  int64_t bytes_per_measurement = int64_t{1} << 30;
  if (quick) {
    sizes = {64 * kKiB, 1 * kMiB};
    bytes_per_measurement = 16 * kMiB;
    reps = 1;
  }
  const int64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());

  cudaDeviceProp props{};
  Check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  Check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  Check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");

  // What growing the pinned pool costs: cudaHostAlloc / cudaFreeHost of one
  // default-size slab (64 MiB).
  std::vector<double> host_alloc_ms, host_free_ms;
  for (int i = 0; i < 3; ++i) {
    void* slab = nullptr;
    Clock::time_point a = Clock::now();
    Check(cudaHostAlloc(&slab, 64 * kMiB, cudaHostAllocPortable),
          "cudaHostAlloc");
    host_alloc_ms.push_back(Seconds(Clock::now() - a) * 1e3);
    a = Clock::now();
    Check(cudaFreeHost(slab), "cudaFreeHost");
    host_free_ms.push_back(Seconds(Clock::now() - a) * 1e3);
  }

  Raw raw(max_bytes);
  ThroughBackend through(max_bytes, CudaOptions{});

  std::vector<Row> rows;
  std::ostringstream growth;
  for (int64_t bytes : sizes) {
    const int64_t count = std::max<int64_t>(8, bytes_per_measurement / bytes);
    for (Direction dir : {Direction::kD2H, Direction::kH2D, Direction::kBoth}) {
      // Warm-up: one round of each, and +alloc until the pools stop
      // growing (a run that finds the pinned pool too small waits for
      // cudaHostAlloc, tens of ms per slab).
      raw.Run(dir, bytes, count);
      through.Run(dir, bytes, count, false);
      for (int round = 0; round < 10; ++round) {
        const CudaBackendStats before = Take(through.backend().stats());
        through.Run(dir, bytes, count, true);
        const CudaBackendStats after = Take(through.backend().stats());
        if (after.pinned_slab_allocations == before.pinned_slab_allocations &&
            after.device_pool_reserved_high ==
                before.device_pool_reserved_high) {
          break;
        }
      }
      const CudaBackendStats measured_from = Take(through.backend().stats());
      std::vector<double> d2h[3], h2d[3], us[3];
      for (int rep = 0; rep < reps; ++rep) {
        for (int k = 0; k < 3; ++k) {
          const Sample s = kImpls[k] == Impl::kRaw
                               ? raw.Run(dir, bytes, count)
                               : through.Run(dir, bytes, count,
                                             kImpls[k] == Impl::kBackendAlloc);
          d2h[k].push_back(s.d2h_gbps);
          h2d[k].push_back(s.h2d_gbps);
          us[k].push_back(s.enqueue_us_per_copy);
        }
      }
      const CudaBackendStats measured_to = Take(through.backend().stats());
      if (measured_to.pinned_slab_allocations !=
          measured_from.pinned_slab_allocations) {
        growth << SizeName(bytes) << " " << DirectionName(dir) << ": +"
               << measured_to.pinned_slab_allocations -
                      measured_from.pinned_slab_allocations
               << " pinned slabs while measuring\n";
      }
      for (bool d2h_side : {true, false}) {
        if (dir == Direction::kD2H && !d2h_side) continue;
        if (dir == Direction::kH2D && d2h_side) continue;
        Row row{bytes, dir, d2h_side, {}, {}, through.last_times()};
        for (int k = 0; k < 3; ++k) {
          row.gbps[k] = Median(d2h_side ? d2h[k] : h2d[k]);
          row.us_per_copy[k] = Median(us[k]);
        }
        rows.push_back(row);
      }
    }
  }

  // Diagnostics: D2H alone, where the destination or the calls around the
  // copy differ.
  std::ostringstream diag;
  if (!quick) {
    diag << "\nD2H alone, variants (median of " << reps << "; GB/s, host "
         << "us per copy; for +alloc the mean / max us of each call):\n\n"
         << "| size | raw fixed | raw ring | backend fixed | backend ring | "
         << "backend fixed + Record | +alloc | +alloc us: alloc / copy / "
         << "free (max) |\n|---|---|---|---|---|---|---|---|\n";
    for (int64_t bytes : {1 * kMiB, 16 * kMiB}) {
      const int64_t count =
          std::max<int64_t>(8, bytes_per_measurement / bytes);
      std::vector<double> g[6], u[6];
      CallTimes last;
      const CudaBackendStats before = Take(through.backend().stats());
      for (int rep = 0; rep < reps + 1; ++rep) {  // the first is a warm-up
        Sample s[6] = {
            raw.Run(Direction::kD2H, bytes, count),
            raw.RunD2HRing(bytes, count),
            through.RunD2H(D2HVariant::kFixed, bytes, count, nullptr),
            through.RunD2H(D2HVariant::kRing, bytes, count, nullptr),
            through.RunD2H(D2HVariant::kFixedRecord, bytes, count, nullptr),
            through.RunD2H(D2HVariant::kAllocTimed, bytes, count, &last),
        };
        if (rep == 0) continue;
        for (int k = 0; k < 6; ++k) {
          g[k].push_back(s[k].d2h_gbps);
          u[k].push_back(s[k].enqueue_us_per_copy);
        }
      }
      const CudaBackendStats after = Take(through.backend().stats());
      char cell[256];
      diag << "| " << SizeName(bytes);
      for (int k = 0; k < 6; ++k) {
        std::snprintf(cell, sizeof(cell), " | %.1f (%.2f us)", Median(g[k]),
                      Median(u[k]));
        diag << cell;
      }
      std::snprintf(cell, sizeof(cell),
                    " | %.2f / %.2f / %.2f (%.0f / %.0f / %.0f) |\n",
                    last.alloc_us, last.copy_us, last.free_us,
                    last.max_alloc_us, last.max_copy_us, last.max_free_us);
      diag << cell;
      std::snprintf(cell, sizeof(cell),
                    "|  | pool during these runs: +%lld slabs, +%lld "
                    "blocking waits | | | | | | |\n",
                    static_cast<long long>(after.pinned_slab_allocations -
                                           before.pinned_slab_allocations),
                    static_cast<long long>(after.pinned_blocking_waits -
                                           before.pinned_blocking_waits));
      diag << cell;
    }
  }

  // Host cost of Copy's range check: 64 KiB copies, both directions at
  // once, are bound by the host's enqueue rate.
  if (!quick) {
    CudaOptions unchecked;
    unchecked.check_copy_ranges = false;
    ThroughBackend fast(64 * kMiB, unchecked);
    const int64_t bytes = 64 * kKiB;
    const int64_t count = bytes_per_measurement / bytes;
    std::vector<double> g[3], u[3];
    for (int rep = 0; rep < reps + 1; ++rep) {
      Sample s[3] = {raw.Run(Direction::kBoth, bytes, count),
                     through.Run(Direction::kBoth, bytes, count, false),
                     fast.Run(Direction::kBoth, bytes, count, false)};
      if (rep == 0) continue;
      for (int k = 0; k < 3; ++k) {
        g[k].push_back(s[k].d2h_gbps);
        u[k].push_back(s[k].enqueue_us_per_copy);
      }
    }
    char cell[512];
    std::snprintf(cell, sizeof(cell),
                  "\n64 KiB, both at once, D2H GB/s (host us per Copy): raw "
                  "%.1f (%.2f), backend %.1f (%.2f), backend without range "
                  "checks %.1f (%.2f)\n",
                  Median(g[0]), Median(u[0]), Median(g[1]), Median(u[1]),
                  Median(g[2]), Median(u[2]));
    diag << cell;
  }

  const CudaBackendStats stats = Take(through.backend().stats());
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "Device: %s (PCI %04x:%02x:%02x), asyncEngineCount %d, "
                "driver %d, runtime %d\n",
                props.name, props.pciDomainID, props.pciBusID,
                props.pciDeviceID, props.asyncEngineCount, driver, runtime);
  out << line;
  std::snprintf(line, sizeof(line),
                "cudaHostAlloc of a 64 MiB slab: %.1f ms, cudaFreeHost: %.1f "
                "ms (median of 3).\n",
                Median(host_alloc_ms), Median(host_free_ms));
  out << line;
  std::snprintf(line, sizeof(line),
                "Per measurement: about %lld MiB per direction (at least 8 "
                "copies); median of %d repetitions.\n\n",
                static_cast<long long>(bytes_per_measurement / kMiB), reps);
  out << line;
  out << "| size | direction | raw GB/s | backend GB/s | backend % of raw | "
         "+alloc GB/s | +alloc % of raw | raw us/call | backend us/call | "
         "+alloc us/call | +alloc D2H us: alloc / copy / free (max) |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& row : rows) {
    std::string dir = DirectionName(row.dir);
    std::string times = "";
    if (row.d2h_side) {
      char cell[128];
      const CallTimes& t = row.alloc_times;
      std::snprintf(cell, sizeof(cell), "%.1f / %.1f / %.1f (%.0f / %.0f / %.0f)",
                    t.alloc_us, t.copy_us, t.free_us, t.max_alloc_us,
                    t.max_copy_us, t.max_free_us);
      times = cell;
    }
    if (row.dir == Direction::kBoth) {
      dir = row.d2h_side ? "D2H (both at once)" : "H2D (both at once)";
    }
    std::snprintf(
        line, sizeof(line),
        "| %s | %s | %.1f | %.1f | %.1f%% | %.1f | %.1f%% | %.2f | %.2f | "
        "%.2f | %s |\n",
        SizeName(row.bytes).c_str(), dir.c_str(), row.gbps[0], row.gbps[1],
        100.0 * row.gbps[1] / row.gbps[0], row.gbps[2],
        100.0 * row.gbps[2] / row.gbps[0], row.us_per_copy[0],
        row.us_per_copy[1], row.us_per_copy[2], times.c_str());
    out << line;
  }
  std::snprintf(line, sizeof(line),
                "\nBackend pools after the run: %lld pinned slab allocations "
                "(%lld bytes, %lld blocking waits), device pool reserved %llu "
                "bytes (high %llu), %lld events created.\n",
                static_cast<long long>(stats.pinned_slab_allocations),
                static_cast<long long>(stats.pinned_slab_bytes),
                static_cast<long long>(stats.pinned_blocking_waits),
                static_cast<unsigned long long>(
                    stats.device_pool_reserved_bytes),
                static_cast<unsigned long long>(
                    stats.device_pool_reserved_high),
                static_cast<long long>(stats.events_created));
  out << line;
  out << "Pool growth while measuring: "
      << (growth.str().empty() ? std::string("none\n") : "\n" + growth.str());
  out << diag.str();
  std::fputs(out.str().c_str(), stdout);
  if (!out_path.empty()) {
    std::ofstream file(out_path);
    file << out.str();
    if (!file) Die("cannot write " + out_path);
  }
  return 0;
}

}  // namespace
}  // namespace offload

int main(int argc, char** argv) { return offload::Main(argc, argv); }
