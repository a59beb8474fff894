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
// The runs themselves are in copy_runs.h.
//
// Usage: cuda_copy_benchmark [--quick] [--reps N] [--out FILE.md]
//   --quick: 64 KiB and 1 MiB, 16 MiB per measurement, one repetition (for
//   compute-sanitizer).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/bench_util.h"
#include "bench/copy_runs.h"
#include "bench/cuda_check.h"

namespace offload::bench {
namespace {

enum class Impl { kRaw, kBackend, kBackendAlloc };
constexpr Impl kImpls[] = {Impl::kRaw, Impl::kBackend, Impl::kBackendAlloc};

struct Options {
  bool quick = false;
  int reps = 5;
  std::string out_path;
  std::vector<int64_t> sizes = {64 * kKiB, 1 * kMiB, 16 * kMiB, 256 * kMiB};
  int64_t bytes_per_measurement = int64_t{1} << 30;

  // Copies per measurement of `bytes` each: bytes_per_measurement, at least 8.
  int64_t Count(int64_t bytes) const {
    return std::max<int64_t>(8, bytes_per_measurement / bytes);
  }
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--out" && i + 1 < argc) {
      o.out_path = argv[++i];
    } else {
      Die("unknown argument " + arg +
          " (usage: [--quick] [--reps N] [--out FILE.md])");
    }
  }
  if (o.quick) {
    o.sizes = {64 * kKiB, 1 * kMiB};
    o.bytes_per_measurement = 16 * kMiB;
    o.reps = 1;
  }
  return o;
}

// The report's first line: the device, runtime and driver.
std::string DeviceLine() {
  cudaDeviceProp props{};
  Cuda(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  Cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  Cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  char line[512];
  std::snprintf(line, sizeof(line),
                "Device: %s (PCI %04x:%02x:%02x), asyncEngineCount %d, "
                "driver %d, runtime %d\n",
                props.name, props.pciDomainID, props.pciBusID,
                props.pciDeviceID, props.asyncEngineCount, driver, runtime);
  return line;
}

// What growing the pinned pool costs: cudaHostAlloc / cudaFreeHost of one
// default-size slab (64 MiB), the median of 3, as the report's line.
std::string HostAllocLine() {
  std::vector<double> alloc_ms, free_ms;
  for (int i = 0; i < 3; ++i) {
    void* slab = nullptr;
    Clock::time_point a = Clock::now();
    Cuda(cudaHostAlloc(&slab, 64 * kMiB, cudaHostAllocPortable),
         "cudaHostAlloc");
    alloc_ms.push_back(NsSince(a) / 1e6);
    a = Clock::now();
    Cuda(cudaFreeHost(slab), "cudaFreeHost");
    free_ms.push_back(NsSince(a) / 1e6);
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "cudaHostAlloc of a 64 MiB slab: %.1f ms, cudaFreeHost: %.1f "
                "ms (median of 3).\n",
                Median(alloc_ms), Median(free_ms));
  return line;
}

// ---------------------------------------------------------------------------
// The table.

struct Row {
  int64_t bytes;
  Direction dir;
  bool d2h_side;  // which direction's figure this row shows
  double gbps[3];
  double us_per_copy[3];
  CallTimes alloc_times;  // +alloc D2H calls, last repetition
};

// One round of each implementation, and +alloc until the pools stop growing
// (a run that finds the pinned pool too small waits for cudaHostAlloc, tens
// of ms per slab).
void WarmUp(RawCopies& raw, BackendCopies& through, Direction dir,
            int64_t bytes, int64_t count) {
  raw.Run(dir, bytes, count);
  through.Run(dir, bytes, count, false);
  for (int round = 0; round < 10; ++round) {
    const CudaBackendStats before = Must(through.backend().stats(), "stats");
    through.Run(dir, bytes, count, true);
    const CudaBackendStats after = Must(through.backend().stats(), "stats");
    if (after.pinned_slab_allocations == before.pinned_slab_allocations &&
        after.device_pool_reserved_high == before.device_pool_reserved_high) {
      break;
    }
  }
}

// The rows of `bytes` in `dir` (one per direction measured), after a warm-up;
// pinned slabs allocated while measuring go to `growth`.
void MeasureRows(const Options& o, RawCopies& raw, BackendCopies& through,
                 int64_t bytes, Direction dir, std::vector<Row>* rows,
                 std::ostringstream* growth) {
  const int64_t count = o.Count(bytes);
  WarmUp(raw, through, dir, bytes, count);
  const CudaBackendStats from = Must(through.backend().stats(), "stats");
  std::vector<double> d2h[3], h2d[3], us[3];
  for (int rep = 0; rep < o.reps; ++rep) {
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
  const CudaBackendStats to = Must(through.backend().stats(), "stats");
  if (to.pinned_slab_allocations != from.pinned_slab_allocations) {
    *growth << SizeName(bytes) << " " << DirectionName(dir) << ": +"
            << to.pinned_slab_allocations - from.pinned_slab_allocations
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
    rows->push_back(row);
  }
}

std::string TableRow(const Row& row) {
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
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "| %s | %s | %.1f | %.1f | %.1f%% | %.1f | %.1f%% | %.2f | %.2f | "
      "%.2f | %s |\n",
      SizeName(row.bytes).c_str(), dir.c_str(), row.gbps[0], row.gbps[1],
      100.0 * row.gbps[1] / row.gbps[0], row.gbps[2],
      100.0 * row.gbps[2] / row.gbps[0], row.us_per_copy[0], row.us_per_copy[1],
      row.us_per_copy[2], times.c_str());
  return line;
}

// ---------------------------------------------------------------------------
// After the table (not with --quick).

// One size of the D2H variants: the median of `reps` after a warm-up round.
std::string D2HVariantsRow(int reps, int64_t count, RawCopies& raw,
                           BackendCopies& through, int64_t bytes) {
  std::vector<double> g[6], u[6];
  CallTimes last;
  const CudaBackendStats before = Must(through.backend().stats(), "stats");
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
  const CudaBackendStats after = Must(through.backend().stats(), "stats");
  std::ostringstream row;
  char cell[256];
  row << "| " << SizeName(bytes);
  for (int k = 0; k < 6; ++k) {
    std::snprintf(cell, sizeof(cell), " | %.1f (%.2f us)", Median(g[k]),
                  Median(u[k]));
    row << cell;
  }
  std::snprintf(cell, sizeof(cell),
                " | %.2f / %.2f / %.2f (%.0f / %.0f / %.0f) |\n", last.alloc_us,
                last.copy_us, last.free_us, last.max_alloc_us, last.max_copy_us,
                last.max_free_us);
  row << cell;
  std::snprintf(cell, sizeof(cell),
                "|  | pool during these runs: +%lld slabs, +%lld "
                "blocking waits | | | | | | |\n",
                static_cast<long long>(after.pinned_slab_allocations -
                                       before.pinned_slab_allocations),
                static_cast<long long>(after.pinned_blocking_waits -
                                       before.pinned_blocking_waits));
  row << cell;
  return row.str();
}

// D2H alone, where the destination or the calls around the copy differ.
std::string D2HVariants(const Options& o, RawCopies& raw,
                        BackendCopies& through) {
  std::ostringstream diag;
  diag << "\nD2H alone, variants (median of " << o.reps << "; GB/s, host "
       << "us per copy; for +alloc the mean / max us of each call):\n\n"
       << "| size | raw fixed | raw ring | backend fixed | backend ring | "
       << "backend fixed + Record | +alloc | +alloc us: alloc / copy / "
       << "free (max) |\n|---|---|---|---|---|---|---|---|\n";
  for (int64_t bytes : {1 * kMiB, 16 * kMiB}) {
    diag << D2HVariantsRow(o.reps, o.Count(bytes), raw, through, bytes);
  }
  return diag.str();
}

// Host cost of Copy's range check: 64 KiB copies, both directions at once,
// are bound by the host's enqueue rate.
std::string RangeCheckCost(const Options& o, RawCopies& raw,
                           BackendCopies& through) {
  CudaOptions unchecked;
  unchecked.check_copy_ranges = false;
  BackendCopies fast(64 * kMiB, unchecked);
  const int64_t bytes = 64 * kKiB;
  const int64_t count = o.bytes_per_measurement / bytes;
  std::vector<double> g[3], u[3];
  for (int rep = 0; rep < o.reps + 1; ++rep) {  // the first is a warm-up
    Sample s[3] = {raw.Run(Direction::kBoth, bytes, count),
                   through.Run(Direction::kBoth, bytes, count, false),
                   fast.Run(Direction::kBoth, bytes, count, false)};
    if (rep == 0) continue;
    for (int k = 0; k < 3; ++k) {
      g[k].push_back(s[k].d2h_gbps);
      u[k].push_back(s[k].enqueue_us_per_copy);
    }
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "\n64 KiB, both at once, D2H GB/s (host us per Copy): raw "
                "%.1f (%.2f), backend %.1f (%.2f), backend without range "
                "checks %.1f (%.2f)\n",
                Median(g[0]), Median(u[0]), Median(g[1]), Median(u[1]),
                Median(g[2]), Median(u[2]));
  return line;
}

// ---------------------------------------------------------------------------
// The report.

// The table's header: what a measurement is, and the column names.
std::string TableHeader(const Options& o) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "Per measurement: about %lld MiB per direction (at least 8 "
                "copies); median of %d repetitions.\n\n",
                static_cast<long long>(o.bytes_per_measurement / kMiB), o.reps);
  return std::string(line) +
         "| size | direction | raw GB/s | backend GB/s | backend % of raw | "
         "+alloc GB/s | +alloc % of raw | raw us/call | backend us/call | "
         "+alloc us/call | +alloc D2H us: alloc / copy / free (max) |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|\n";
}

// The backend's pools after the run, and their growth while measuring.
std::string PoolLines(const CudaBackendStats& stats,
                      const std::string& growth) {
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "\nBackend pools after the run: %lld pinned slab allocations "
      "(%lld bytes, %lld blocking waits), device pool reserved %llu "
      "bytes (high %llu), %lld events created.\n",
      static_cast<long long>(stats.pinned_slab_allocations),
      static_cast<long long>(stats.pinned_slab_bytes),
      static_cast<long long>(stats.pinned_blocking_waits),
      static_cast<unsigned long long>(stats.device_pool_reserved_bytes),
      static_cast<unsigned long long>(stats.device_pool_reserved_high),
      static_cast<long long>(stats.events_created));
  return std::string(line) + "Pool growth while measuring: " +
         (growth.empty() ? std::string("none\n") : "\n" + growth);
}

int Main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  const int64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::string out = DeviceLine();
  out += HostAllocLine();

  RawCopies raw(max_bytes);
  BackendCopies through(max_bytes, CudaOptions{});
  std::vector<Row> rows;
  std::ostringstream growth;
  for (int64_t bytes : o.sizes) {
    for (Direction dir : {Direction::kD2H, Direction::kH2D, Direction::kBoth}) {
      MeasureRows(o, raw, through, bytes, dir, &rows, &growth);
    }
  }
  std::string diag;
  if (!o.quick) {
    diag = D2HVariants(o, raw, through);
    diag += RangeCheckCost(o, raw, through);
  }

  out += TableHeader(o);
  for (const Row& row : rows) out += TableRow(row);
  out += PoolLines(Must(through.backend().stats(), "stats"), growth.str());
  out += diag;
  std::fputs(out.c_str(), stdout);
  if (!o.out_path.empty()) {
    std::ofstream file(o.out_path);
    file << out;
    if (!file) Die("cannot write " + o.out_path);
  }
  return 0;
}

}  // namespace
}  // namespace offload::bench

int main(int argc, char** argv) { return offload::bench::Main(argc, argv); }
