// Counts of the CUDA runtime calls the engine makes per offloaded tensor
// (issue 11 item 4), for layer_stack_bench. The library carries
// -Wl,--wrap=<call> for each call of CudaCall (cudaMemcpyAsync is counted by
// copy_interposer's wrapper, CopyTimer::calls), so every such call of the
// program (the CudaBackend's included) lands in a counting wrapper first.
//
// MeasureCallCounts runs, for k = 0 .. kmax offloaded layers and each
// --budget_k (the byte budget: its first warm-up step records), an Offloader
// set up as the sweep's (offload_sweep.h), its warm-up steps, then one step
// with counting on. Per k it reports (calls at k - calls at k = 0) divided
// by the tensors offloaded in that step: what offloading adds per offloaded
// tensor. The benchmark's own calls (its GEMMs' timing events, the
// activations' allocations and frees) are the same at every k and cancel;
// so does the free of an offloaded activation, which moves from the caller
// to the engine. Copy timing (CopyTimer) is off while counting.
//
// Single-threaded, like copy_interposer: only the benchmark's host thread
// uses it.

#ifndef OFFLOAD_BENCH_CALL_COUNTER_H_
#define OFFLOAD_BENCH_CALL_COUNTER_H_

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/flags.h"
#include "bench/gpu_exec.h"

namespace offload::bench {

enum CudaCall {
  kEventCreate,       // cudaEventCreateWithFlags
  kEventDestroy,      // cudaEventDestroy
  kEventRecord,       // cudaEventRecord
  kStreamWaitEvent,   // cudaStreamWaitEvent
  kEventQuery,        // cudaEventQuery
  kMemcpyAsync,       // cudaMemcpyAsync (copy_interposer's wrapper)
  kMallocFromPool,    // cudaMallocFromPoolAsync
  kFreeAsync,         // cudaFreeAsync
  kHostAlloc,         // cudaHostAlloc
  kGetDevice,         // cudaGetDevice (CudaBackend::UseDevice, every op)
  kCudaCalls
};
inline constexpr const char* kCudaCallNames[kCudaCalls] = {
    "EventCreate", "EventDestroy", "EventRecord", "StreamWaitEvent",
    "EventQuery",  "MemcpyAsync",  "MallocAsync", "FreeAsync",
    "HostAlloc",   "GetDevice"};

// One k: calls per offloaded tensor by kind, beyond k = 0's, and the host
// time in them (the wrappers time each real call).
struct CallCountRow {
  int k = 0;              // -1: a byte-budget row
  double budget_k = -1;   // its --budget_k
  int64_t offloaded = 0;  // tensors offloaded in the counted step
  double per_tensor[kCudaCalls] = {};
  double total = 0;  // all kinds but GetDevice (no driver call)
  double us_per_tensor[kCudaCalls] = {};
  double us_total = 0;  // all kinds
  // Host time in all Offloader calls of the counted step beyond k = 0's,
  // per offloaded tensor: the runtime calls plus the engine and backend.
  double engine_us_per_tensor = 0;
};

std::vector<CallCountRow> MeasureCallCounts(GpuExec& ex, CudaBackend& be,
                                            const Flags& flags);

// The table, to stdout ("## CUDA runtime calls per offloaded tensor").
void PrintCallCounts(const std::vector<CallCountRow>& rows);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_CALL_COUNTER_H_
