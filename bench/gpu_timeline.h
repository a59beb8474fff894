// Timelines of the layer stack on the real GPU (issue 12): one step with
// every GEMM and every engine copy bracketed by CUDA events, turned into an
// offload::timeline::Timeline (timeline/timeline.h) — the same data the
// simulator's pictures are drawn from — and written as Chrome trace-event
// JSON and as an SVG figure.
//
// Times are cudaEventElapsedTime from one origin event recorded on the
// compute stream at the step's start. Tracks:
//   compute      one slice per GEMM ("fwd qkv L3", kind forward for GEMMs
//                0-4, backward for 5-14, label "L3"), and a stall slice
//                "compute idle" for each gap of >= 50 us between two GEMMs
//                (nothing of the step ran on the compute stream then: it
//                waited for an event or for the host)
//   offload_d2h  one slice per engine copy to host (kind d2h)
//   offload_h2d  one slice per engine copy to device (kind h2d)
// Copies carry args bytes and GB/s. Their layer is inferred from the order
// and sizes of the copies (the default schedule offloads layers 0..k-1 in
// order and reloads them in reverse, each layer's saved bytes in full); when
// the copies do not add up to that, they are left unlabelled.
// Counter "device bytes": CudaBackendStats::device_bytes_in_use read on the
// host as each GEMM is enqueued, drawn at that GEMM's start on the GPU. It
// is the activations allocated in host order (allocations and frees are
// stream-ordered), not a reading of the device.

#ifndef OFFLOAD_BENCH_GPU_TIMELINE_H_
#define OFFLOAD_BENCH_GPU_TIMELINE_H_

#include <string>
#include <vector>

#include "bench/gpu_exec.h"
#include "bench/layer_stack.h"
#include "engine/offload.h"
#include "timeline/timeline.h"

namespace offload::bench {

// Runs one untimed step of `off` (k offloaded layers) on `ex`, then one with
// GEMM and copy timing on, and returns the latter's timeline. Dies on a
// CUDA error.
// REQUIRES: GlobalCopyTimer() has its compute stream and its event pool.
timeline::Timeline CaptureStepTimeline(GpuExec& ex, Offloader& off,
                                       const Shape& s, int k);

// Prints a Markdown table to stdout: per timeline the step on the GPU
// clock, the GEMM time, the compute stream's idle time, and how much of
// the copies' time a GEMM was running beside them.
void PrintTimelineSummary(const std::vector<timeline::Timeline>& timelines);

// Writes <prefix>.json (ToChromeTraceJson) and <prefix>.svg (ToSvg, the
// timelines stacked as panels on one time axis). Returns false (after a
// message on stderr) if a file could not be written.
bool WriteTimelines(const std::vector<timeline::Timeline>& timelines,
                    const std::string& prefix);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_GPU_TIMELINE_H_
