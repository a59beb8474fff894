#include "bench/copy_interposer.h"

#include <chrono>

extern "C" cudaError_t __real_cudaMemPoolCreate(cudaMemPool_t* pool,
                                                const cudaMemPoolProps* props);

namespace offload::bench {
namespace {

CopyTimer g_copies;
cudaMemPool_t g_pool = nullptr;

}  // namespace

CopyTimer& GlobalCopyTimer() { return g_copies; }

cudaMemPool_t SeenMemPool() { return g_pool; }

}  // namespace offload::bench

using offload::bench::CopyRecord;
using offload::bench::CopyTimer;

extern "C" cudaError_t __wrap_cudaMemcpyAsync(void* dst, const void* src,
                                              size_t count, cudaMemcpyKind kind,
                                              cudaStream_t stream) {
  CopyTimer& t = offload::bench::GlobalCopyTimer();
  ++t.calls;
  if (!t.enabled || stream == t.compute) {
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t e = __real_cudaMemcpyAsync(dst, src, count, kind, stream);
    t.host_ns += std::chrono::duration<double, std::nano>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
    return e;
  }
  if (t.next + 2 > t.pool.size()) {
    t.overflow = true;
    return __real_cudaMemcpyAsync(dst, src, count, kind, stream);
  }
  CopyRecord r;
  r.start = t.pool[t.next++];
  r.end = t.pool[t.next++];
  r.bytes = count;
  cudaPointerAttributes attr{};
  r.d2h = cudaPointerGetAttributes(&attr, dst) == cudaSuccess &&
          attr.type == cudaMemoryTypeHost;
  cudaEventRecord(r.start, stream);
  cudaError_t e = __real_cudaMemcpyAsync(dst, src, count, kind, stream);
  cudaEventRecord(r.end, stream);
  t.records.push_back(r);
  return e;
}

extern "C" cudaError_t __wrap_cudaMemPoolCreate(cudaMemPool_t* pool,
                                                const cudaMemPoolProps* props) {
  cudaError_t e = __real_cudaMemPoolCreate(pool, props);
  if (e == cudaSuccess) offload::bench::g_pool = *pool;
  return e;
}
