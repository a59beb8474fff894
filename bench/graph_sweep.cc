#include "bench/graph_sweep.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/copy_interposer.h"
#include "bench/cuda_check.h"
#include "bench/layer_stack.h"
#include "engine/backend.h"
#include "engine/offload.h"

namespace offload::bench {
namespace {

// Whether the weight-gradient hashes (all but the output's, the first) agree.
bool SameGradients(const std::vector<uint64_t>& a,
                   const std::vector<uint64_t>& b) {
  return a.size() == b.size() && a.size() > 1 &&
         std::equal(a.begin() + 1, a.end(), b.begin() + 1);
}

// Nanoseconds from `a` to `b`.
double Ns(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

// Medians of the timed steps.
struct Samples {
  std::vector<double> wall, gpu, host, inner;
};

}  // namespace

std::vector<GraphRow> RunGraphRows(GpuExec& ex, CudaBackend& be,
                                   const Flags& flags) {
  const Shape& s = flags.shape;
  const cudaStream_t stream = ex.stream();
  Stream& compute = be.ComputeStream();
  cudaEvent_t start = nullptr, end = nullptr;
  Cuda(cudaEventCreate(&start), "cudaEventCreate");
  Cuda(cudaEventCreate(&end), "cudaEventCreate");
  // Ends a timed step begun at `t0` (start recorded): wall and GPU time.
  auto finish_step = [&](Clock::time_point t0, Samples& out) {
    Cuda(cudaEventRecord(end, stream), "record");
    Cuda(cudaDeviceSynchronize(), "sync");
    out.wall.push_back(NsSince(t0));
    float ms = 0;
    Cuda(cudaEventElapsedTime(&ms, start, end), "elapsed");
    out.gpu.push_back(double(ms) * 1e6);
  };

  std::vector<GraphRow> rows;
  for (const int k : flags.graph_k) {
    GraphRow row;
    row.k = k;
    const OffloadOptions oo = BenchOptions(s, k, -1, flags.retain);

    // 1. Eager.
    std::vector<uint64_t> eager_hashes;
    {
      auto off = Must(Offloader::Create(be, oo), "Offloader::Create");
      for (int w = 0; w < flags.warmup; ++w) RunStep(ex, *off, s);
      Cuda(cudaDeviceSynchronize(), "sync");
      uint64_t zero = 0;
      Cuda(cudaMemPoolSetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                                   &zero),
           "reset UsedMemHigh");
      const int64_t offloaded0 = off->stats().tensors_offloaded;
      Samples eager;
      for (int i = 0; i < flags.steps; ++i) {
        Cuda(cudaDeviceSynchronize(), "sync");
        const Clock::time_point t0 = Clock::now();
        Cuda(cudaEventRecord(start, stream), "record");
        const StepCost c = RunStep(ex, *off, s);
        eager.host.push_back(NsSince(t0));
        eager.inner.push_back(c.engine_host_ns);
        finish_step(t0, eager);
      }
      row.offloaded_tensors =
          double(off->stats().tensors_offloaded - offloaded0) / flags.steps;
      unsigned long long high = 0;
      Cuda(cudaMemPoolGetAttribute(SeenMemPool(), cudaMemPoolAttrUsedMemHigh,
                                   &high),
           "UsedMemHigh");
      row.eager_peak = high;
      row.eager_wall_ns = Median(eager.wall);
      row.eager_gpu_ns = Median(eager.gpu);
      row.eager_host_ns = Median(eager.host);
      row.eager_engine_ns = Median(eager.inner);
      ex.set_capture(true);
      RunStep(ex, *off, s);
      Cuda(cudaDeviceSynchronize(), "sync");
      ex.set_capture(false);
      eager_hashes = ex.Hashes();
      for (const std::string& w : off->diagnostics().warnings()) {
        std::fprintf(stderr, "  engine warning (eager k=%d): %s\n", k,
                     w.c_str());
      }
    }

    // 2. Graph, timed. Only this graph's memory is mapped from here.
    Must(be.Trim(), "Trim");
    {
      auto off = Must(Offloader::Create(be, oo), "Offloader::Create");
      CapturedStep captured = CaptureStep(ex, *off, s, 1);
      row.capture_ns = captured.capture_ns;
      row.nodes = captured.graph->size();
      const Clock::time_point ti = Clock::now();
      std::unique_ptr<GraphExec> exec =
          Must(be.Instantiate(*captured.graph), "Instantiate");
      row.instantiate_ns = NsSince(ti);
      ex.ClearResults();
      ResetGraphMemoryHigh(be.device());
      for (int w = 0; w < flags.warmup; ++w) {
        Must(be.Launch(*exec, compute), "Launch");
      }
      Samples graph;
      for (int i = 0; i < flags.steps; ++i) {
        Cuda(cudaDeviceSynchronize(), "sync");
        const Clock::time_point t0 = Clock::now();
        Cuda(cudaEventRecord(start, stream), "record");
        const Clock::time_point tl = Clock::now();
        Must(be.Launch(*exec, compute), "Launch");
        const Clock::time_point done = Clock::now();
        graph.inner.push_back(Ns(tl, done));
        graph.host.push_back(Ns(t0, done));
        finish_step(t0, graph);
      }
      row.graph_memory = GraphMemory(be.device());
      row.graph_wall_ns = Median(graph.wall);
      row.graph_gpu_ns = Median(graph.gpu);
      row.graph_host_ns = Median(graph.host);
      row.launch_ns = Median(graph.inner);
      row.grads_identical = SameGradients(ex.Hashes(), eager_hashes);
      for (const std::string& w : off->diagnostics().warnings()) {
        std::fprintf(stderr, "  engine warning (graph k=%d): %s\n", k,
                     w.c_str());
      }
    }  // the exec, then the graph, then the Offloader

    // 3. Graph with the output copy, launched once: every byte.
    Must(be.Trim(), "Trim");
    {
      auto off = Must(Offloader::Create(be, oo), "Offloader::Create");
      ex.set_capture(true);
      CapturedStep captured = CaptureStep(ex, *off, s, 1);
      ex.set_capture(false);
      std::unique_ptr<GraphExec> exec =
          Must(be.Instantiate(*captured.graph), "Instantiate");
      ex.ClearResults();
      Must(be.Launch(*exec, compute), "Launch");
      Cuda(cudaDeviceSynchronize(), "sync");
      row.identical = ex.Hashes() == eager_hashes;
    }
    Must(be.Trim(), "Trim");

    rows.push_back(row);
    std::fprintf(stderr,
                 "graph k=%d done: eager %.2f ms, graph %.2f ms; host per "
                 "step: eager %.1f us, graph %.1f us; bytes %s\n",
                 k, row.eager_wall_ns / 1e6, row.graph_wall_ns / 1e6,
                 row.eager_host_ns / 1e3, row.graph_host_ns / 1e3,
                 row.identical && row.grads_identical ? "identical"
                                                      : "DIFFER");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return rows;
}

}  // namespace offload::bench
