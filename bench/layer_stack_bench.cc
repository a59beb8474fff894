// GPU benchmark of the offload engine on a transformer-block-like layer stack
// with real bf16 GEMMs (cuBLAS), measured against the schedule's lower bound
// (the same schedule on the SimBackend with the measured kernel durations and
// the measured pinned copy bandwidth). See docs/benchmarks.md.
//
//   layer_stack_bench --hidden=4096 --tokens=8192 [--layers=8] [--steps=5]
//                     [--warmup=2] [--kmax=6] [--retain]
//
// Per layer, forward (row-major, bf16, fp32 accumulation):
//   qkv  = x    · Wqkv  [T,H]x[H,3H]     saved: x, qkv, attn, o, u
//   attn = qkv  · Wa    [T,3H]x[3H,H]    (stand-in for attention)
//   o    = attn · Wo    [T,H]x[H,H]
//   u    = o    · Wup   [T,H]x[H,4H]
//   y    = u    · Wdown [T,4H]x[4H,H]    (the next layer's x)
// Backward: for each forward GEMM, the input gradient and the weight gradient
// (2x the forward work); each weight gradient reads a popped activation.
// The weights are shared by the layers; the gradients are per layer.
//
// Copy timing: the binary is linked with -Wl,--wrap=cudaMemcpyAsync, so every
// copy the CudaBackend enqueues on a stream other than the compute stream can
// be bracketed by timed events (only in the steps that measure copies).
// -Wl,--wrap=cudaMemPoolCreate gives the backend's device pool, whose
// UsedMemHigh is the activations' peak (weights, gradients and workspaces
// come from plain cudaMalloc).

#include <cuda_runtime.h>
#include <library_types.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/sim/sim_backend.h"
#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"


// The few cuBLAS entry points used, declared here: cublas_v2.h pulls in
// cuda_fp16.h, which needs <nv/target>, a header @cuda//:cudart does not
// export (third_party/cuda.BUILD globs *.h and *.hpp only). The values are
// those of cublas_api.h (CUDA 13).
extern "C" {
typedef struct cublasContext* cublasHandle_t;
typedef int cublasStatus_t;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t s);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                     size_t bytes);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A,
                            cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta,
                            void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
}
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasSetWorkspace cublasSetWorkspace_v2

// ---------------------------------------------------------------------------
// Link-time interposition (see the header comment).

extern "C" cudaError_t __real_cudaMemcpyAsync(void* dst, const void* src,
                                              size_t count, cudaMemcpyKind kind,
                                              cudaStream_t stream);
extern "C" cudaError_t __real_cudaMemPoolCreate(cudaMemPool_t* pool,
                                                const cudaMemPoolProps* props);

namespace {

struct CopyRecord {
  cudaEvent_t start = nullptr, end = nullptr;
  size_t bytes = 0;
  bool d2h = false;
};

struct CopyTimer {
  bool enabled = false;
  cudaStream_t compute = nullptr;
  std::vector<cudaEvent_t> pool;  // timed events
  size_t next = 0;
  std::vector<CopyRecord> records;
  bool overflow = false;
};
CopyTimer g_copies;
cudaMemPool_t g_pool = nullptr;

}  // namespace

extern "C" cudaError_t __wrap_cudaMemcpyAsync(void* dst, const void* src,
                                              size_t count, cudaMemcpyKind kind,
                                              cudaStream_t stream) {
  CopyTimer& t = g_copies;
  if (!t.enabled || stream == t.compute) {
    return __real_cudaMemcpyAsync(dst, src, count, kind, stream);
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
  if (e == cudaSuccess) g_pool = *pool;
  return e;
}

namespace offload {
namespace {

// ---------------------------------------------------------------------------
// Helpers.

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "FATAL: %s\n", what.c_str());
  std::exit(1);
}
void Must(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}
template <typename T>
T Must(StatusOr<T> s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.status().ToString());
  return std::move(s).value();
}
void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    Die(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
        cudaGetErrorString(e));
  }
}
void Blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    Die(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
  }
}

using Clock = std::chrono::steady_clock;
double NsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t HashBytes(const void* data, size_t bytes, uint64_t h = 0) {
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

// ---------------------------------------------------------------------------
// The layer stack, independent of the device.

struct Shape {
  int layers = 8;
  int64_t hidden = 4096;
  int64_t tokens = 8192;
};

// Forward GEMMs 0..4, backward GEMMs 5..14 (see the header comment).
constexpr int kGemms = 15;
const char* const kGemmNames[kGemms] = {
    "fwd qkv",      "fwd attn",   "fwd o",      "fwd up",     "fwd down",
    "bwd d_u",      "bwd dWdown", "bwd d_o",    "bwd dWup",   "bwd d_attn",
    "bwd dWo",      "bwd d_qkv",  "bwd dWa",    "bwd d_x",    "bwd dWqkv"};

// C = op(A) op(B), row-major; op(A) is [M,K], op(B) is [K,N].
struct Gemm {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

// What a step does on its device: the real GPU or the simulator.
class Exec {
 public:
  virtual ~Exec() = default;
  virtual Backend& backend() = 0;
  // Enqueues GEMM `id` of `layer` on the compute stream. `reads` and `write`
  // are the activations it touches (the simulator's kernel declares them).
  virtual void Run(int id, int layer, const Gemm& g,
                   std::vector<const Tensor*> reads, const Tensor* write) = 0;
  // Fills the first layer's input.
  virtual void FillInput(const Tensor& x0) = 0;
  // The last layer's output is final (the real GPU copies it for checking).
  virtual void Output(const Tensor& y) = 0;
  // Fixed buffers (nullptr in the simulator).
  virtual void* weight(int w) = 0;         // 0 qkv, 1 a, 2 o, 3 up, 4 down
  virtual void* grad(int layer, int w) = 0;
  virtual void* work(int i) = 0;           // 0 dtop, 1/2 d ping-pong,
                                           // 3 du, 4 do, 5 dattn, 6 dqkv
};

void* Ptr(const Tensor& t) {
  return static_cast<char*>(t.storage->data()) + t.offset * t.element_size();
}

Tensor NewActivation(Backend& be, int64_t rows, int64_t cols,
                     const std::string& name) {
  Tensor t;
  t.storage = std::make_shared<Storage>(
      Must(be.AllocateDevice(rows * cols * 2, be.ComputeStream()),
           "AllocateDevice"));
  t.dtype = DType::kBF16;
  t.shape = {rows, cols};
  t.strides = ContiguousStrides(t.shape);
  t.name = name;
  return t;
}

// Offloader calls, for the host-cost breakdown.
enum Call { kForwardStep, kPush, kBackwardStep, kPop, kFinishBackward, kCalls };
const char* const kCallNames[kCalls] = {"ForwardStep", "Push", "BackwardStep",
                                        "Pop", "FinishBackward"};

struct StepCost {
  double engine_host_ns = 0;  // wall time inside Offloader calls
  int64_t pushes = 0;
  double call_ns[kCalls] = {};
  int64_t call_count[kCalls] = {};
};

// One training step through the Offloader.
StepCost RunStep(Exec& ex, Offloader& off, const Shape& s) {
  Backend& be = ex.backend();
  const int64_t T = s.tokens, H = s.hidden;
  StepCost cost;
  auto timed_call = [&](Call call, auto&& f) {
    Clock::time_point t0 = Clock::now();
    auto r = f();
    double ns = NsSince(t0);
    cost.engine_host_ns += ns;
    cost.call_ns[call] += ns;
    cost.call_count[call] += 1;
    return r;
  };
  struct Saved {
    SavedTensor x, qkv, attn, o, u;
  };
  std::vector<Saved> saved(s.layers);

  Tensor x = NewActivation(be, T, H, "x0");
  ex.FillInput(x);
  for (int i = 0; i < s.layers; ++i) {
    int layer = Must(timed_call(kForwardStep, [&] { return off.ForwardStep(); }), "ForwardStep");
    if (layer != i) Die("unexpected layer id");
    Tensor qkv = NewActivation(be, T, 3 * H, "qkv");
    ex.Run(0, i, {false, false, T, 3 * H, H, Ptr(x), ex.weight(0), Ptr(qkv)},
           {&x}, &qkv);
    Tensor attn = NewActivation(be, T, H, "attn");
    ex.Run(1, i, {false, false, T, H, 3 * H, Ptr(qkv), ex.weight(1), Ptr(attn)},
           {&qkv}, &attn);
    Tensor o = NewActivation(be, T, H, "o");
    ex.Run(2, i, {false, false, T, H, H, Ptr(attn), ex.weight(2), Ptr(o)},
           {&attn}, &o);
    Tensor u = NewActivation(be, T, 4 * H, "u");
    ex.Run(3, i, {false, false, T, 4 * H, H, Ptr(o), ex.weight(3), Ptr(u)},
           {&o}, &u);
    Tensor y = NewActivation(be, T, H, "y");
    ex.Run(4, i, {false, false, T, H, 4 * H, Ptr(u), ex.weight(4), Ptr(y)},
           {&u}, &y);
    Saved& sv = saved[i];
    sv.x = Must(timed_call(kPush, [&] { return off.Push(x); }), "Push x");
    sv.qkv = Must(timed_call(kPush, [&] { return off.Push(qkv); }), "Push qkv");
    sv.attn = Must(timed_call(kPush, [&] { return off.Push(attn); }), "Push attn");
    sv.o = Must(timed_call(kPush, [&] { return off.Push(o); }), "Push o");
    sv.u = Must(timed_call(kPush, [&] { return off.Push(u); }), "Push u");
    cost.pushes += 5;
    x = std::move(y);  // drops this layer's other tensors
  }
  ex.Output(x);
  x = Tensor();

  void* dy = ex.work(0);
  for (int i = s.layers - 1; i >= 0; --i) {
    Must(timed_call(kBackwardStep, [&] { return off.BackwardStep(i); }), "BackwardStep");
    Saved& sv = saved[i];
    void* du = ex.work(3);
    void* d_o = ex.work(4);
    void* dattn = ex.work(5);
    void* dqkv = ex.work(6);
    void* dx = ex.work(i % 2 ? 1 : 2);
    auto pop = [&](const SavedTensor& st) {
      return Must(timed_call(kPop, [&] { return off.Pop(st); }), "Pop");
    };
    ex.Run(5, i, {false, true, T, 4 * H, H, dy, ex.weight(4), du}, {}, nullptr);
    {
      Tensor u = pop(sv.u);
      ex.Run(6, i, {true, false, 4 * H, H, T, Ptr(u), dy, ex.grad(i, 4)}, {&u},
             nullptr);
    }
    ex.Run(7, i, {false, true, T, H, 4 * H, du, ex.weight(3), d_o}, {}, nullptr);
    {
      Tensor o = pop(sv.o);
      ex.Run(8, i, {true, false, H, 4 * H, T, Ptr(o), du, ex.grad(i, 3)}, {&o},
             nullptr);
    }
    ex.Run(9, i, {false, true, T, H, H, d_o, ex.weight(2), dattn}, {}, nullptr);
    {
      Tensor attn = pop(sv.attn);
      ex.Run(10, i, {true, false, H, H, T, Ptr(attn), d_o, ex.grad(i, 2)},
             {&attn}, nullptr);
    }
    ex.Run(11, i, {false, true, T, 3 * H, H, dattn, ex.weight(1), dqkv}, {},
           nullptr);
    {
      Tensor qkv = pop(sv.qkv);
      ex.Run(12, i, {true, false, 3 * H, H, T, Ptr(qkv), dattn, ex.grad(i, 1)},
             {&qkv}, nullptr);
    }
    ex.Run(13, i, {false, true, T, H, 3 * H, dqkv, ex.weight(0), dx}, {},
           nullptr);
    {
      Tensor xi = pop(sv.x);
      ex.Run(14, i, {true, false, H, 3 * H, T, Ptr(xi), dqkv, ex.grad(i, 0)},
             {&xi}, nullptr);
    }
    sv = Saved();  // as autograd: the saved handles go with the layer
    dy = dx;
  }
  Must(timed_call(kFinishBackward, [&] { return off.FinishBackward(); }), "FinishBackward");
  return cost;
}

// ---------------------------------------------------------------------------
// The real GPU.

class GpuExec final : public Exec {
 public:
  GpuExec(CudaBackend& be, const Shape& s) : be_(be), s_(s) {
    stream_ = Must(be.NativeStream(be.ComputeStream()), "NativeStream");
    Blas(cublasCreate(&blas_), "cublasCreate");
    Blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    Cuda(cudaMalloc(&workspace_, kWorkspace), "cudaMalloc workspace");
    Blas(cublasSetWorkspace(blas_, workspace_, kWorkspace), "SetWorkspace");
    const int64_t H = s.hidden, T = s.tokens;
    const int64_t wsize[5] = {H * 3 * H, 3 * H * H, H * H, H * 4 * H,
                              4 * H * H};
    const int64_t fan_in[5] = {H, 3 * H, H, H, 4 * H};
    uint64_t seed = 12345;
    for (int w = 0; w < 5; ++w) {
      weights_[w] = DeviceRandom(wsize[w], std::sqrt(3.0 / fan_in[w]), seed++);
      wbytes_[w] = wsize[w] * 2;
    }
    grads_.resize(s.layers);
    for (int l = 0; l < s.layers; ++l) {
      for (int w = 0; w < 5; ++w) {
        Cuda(cudaMalloc(&grads_[l][w], wbytes_[w]), "cudaMalloc grad");
      }
    }
    input_ = DeviceRandom(T * H, 1.7, seed++);
    const int64_t wk[7] = {T * H, T * H, T * H, T * 4 * H, T * H, T * H,
                           T * 3 * H};
    work_[0] = DeviceRandom(T * H, 1.0, seed++);
    for (int i = 1; i < 7; ++i) {
      Cuda(cudaMalloc(&work_[i], wk[i] * 2), "cudaMalloc work");
    }
    Cuda(cudaHostAlloc(&out_host_, T * H * 2, cudaHostAllocDefault),
         "cudaHostAlloc out");
    Cuda(cudaHostAlloc(&stage_, 4 * H * H * 2, cudaHostAllocDefault),
         "cudaHostAlloc stage");
    Cuda(cudaDeviceSynchronize(), "init sync");
  }
  ~GpuExec() override {
    cudaDeviceSynchronize();
    for (void* w : weights_) cudaFree(w);
    for (auto& g : grads_) for (void* p : g) cudaFree(p);
    for (void* w : work_) cudaFree(w);
    cudaFree(input_);
    cudaFree(workspace_);
    cudaFreeHost(out_host_);
    cudaFreeHost(stage_);
    for (auto& e : calib_events_) cudaEventDestroy(e);
    cublasDestroy(blas_);
  }

  Backend& backend() override { return be_; }
  void* weight(int w) override { return weights_[w]; }
  void* grad(int layer, int w) override { return grads_[layer][w]; }
  void* work(int i) override { return work_[i]; }

  void Run(int id, int layer, const Gemm& g, std::vector<const Tensor*>,
           const Tensor*) override {
    if (calibrate_) Cuda(cudaEventRecord(CalibEvent(), stream_), "record");
    const float alpha = 1.0f, beta = 0.0f;
    // Column-major: C^T[N,M] = op(B)^T op(A)^T.
    const int lda = g.ta ? g.m : g.k;  // A stored [M,K] or [K,M]
    const int ldb = g.tb ? g.k : g.n;  // B stored [K,N] or [N,K]
    Blas(cublasGemmEx(blas_, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.n), int(g.m),
                      int(g.k), &alpha, g.b, CUDA_R_16BF, ldb, g.a, CUDA_R_16BF,
                      lda, &beta, g.c, CUDA_R_16BF, int(g.n),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
         kGemmNames[id]);
    if (calibrate_) {
      Cuda(cudaEventRecord(CalibEvent(), stream_), "record");
      calib_ids_.push_back(id);
    }
    (void)layer;
  }
  void FillInput(const Tensor& x0) override {
    Cuda(cudaMemcpyAsync(Ptr(x0), input_, x0.nbytes(), cudaMemcpyDeviceToDevice,
                         stream_),
         "fill input");
  }
  void Output(const Tensor& y) override {
    if (!capture_) return;
    Cuda(cudaMemcpyAsync(out_host_, Ptr(y), y.nbytes(),
                         cudaMemcpyDeviceToHost, stream_),
         "copy output");
  }

  // Per-GEMM timing of the steps run while calibrating.
  void StartCalibration() {
    calibrate_ = true;
    calib_next_ = 0;
    calib_ids_.clear();
  }
  // Adds this step's per-GEMM durations (ns) to `samples`.
  void EndCalibration(std::array<std::vector<double>, kGemms>& samples) {
    Cuda(cudaDeviceSynchronize(), "sync");
    for (size_t i = 0; i < calib_ids_.size(); ++i) {
      float ms = 0;
      Cuda(cudaEventElapsedTime(&ms, calib_events_[2 * i],
                                calib_events_[2 * i + 1]),
           "elapsed");
      samples[calib_ids_[i]].push_back(ms * 1e6);
    }
    calibrate_ = false;
  }
  void set_capture(bool c) { capture_ = c; }

  // After a step with capture on: the hash of the output and of each weight
  // gradient (host copies).
  std::vector<uint64_t> Hashes() {
    Cuda(cudaDeviceSynchronize(), "sync");
    std::vector<uint64_t> h;
    h.push_back(HashBytes(out_host_, s_.tokens * s_.hidden * 2));
    for (int l = 0; l < s_.layers; ++l) {
      for (int w = 0; w < 5; ++w) {
        Cuda(cudaMemcpy(stage_, grads_[l][w], wbytes_[w],
                        cudaMemcpyDeviceToHost),
             "copy grad");
        h.push_back(HashBytes(stage_, wbytes_[w]));
      }
    }
    return h;
  }
  cudaStream_t stream() const { return stream_; }

 private:
  static constexpr size_t kWorkspace = size_t{64} << 20;

  // bf16 values uniform in [-scale, scale], made on the host.
  void* DeviceRandom(int64_t n, double scale, uint64_t seed) {
    std::vector<uint16_t> h(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      float f = float(((x >> 40) * (1.0 / 16777216.0) * 2 - 1) * scale);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h[i] = uint16_t(bits >> 16);
    }
    void* d = nullptr;
    Cuda(cudaMalloc(&d, n * 2), "cudaMalloc");
    Cuda(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
    return d;
  }
  cudaEvent_t CalibEvent() {
    if (calib_next_ == calib_events_.size()) {
      cudaEvent_t e;
      Cuda(cudaEventCreate(&e), "cudaEventCreate");
      calib_events_.push_back(e);
    }
    return calib_events_[calib_next_++];
  }

  CudaBackend& be_;
  Shape s_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  void* weights_[5] = {};
  int64_t wbytes_[5] = {};
  std::vector<std::array<void*, 5>> grads_;
  void* work_[7] = {};
  void* input_ = nullptr;
  void* out_host_ = nullptr;
  void* stage_ = nullptr;
  bool calibrate_ = false;
  bool capture_ = false;
  std::vector<cudaEvent_t> calib_events_;
  size_t calib_next_ = 0;
  std::vector<int> calib_ids_;
};

// ---------------------------------------------------------------------------
// The simulator: the same calls, kernels of the measured durations.

class SimExec final : public Exec {
 public:
  SimExec(SimBackend& sim, const std::array<double, kGemms>& ns)
      : sim_(sim), ns_(ns) {}
  Backend& backend() override { return sim_; }
  void* weight(int) override { return nullptr; }
  void* grad(int, int) override { return nullptr; }
  void* work(int) override { return nullptr; }
  void Run(int id, int, const Gemm&, std::vector<const Tensor*> reads,
           const Tensor* write) override {
    SimKernel k;
    k.name = kGemmNames[id];
    k.duration_ns = int64_t(ns_[id] + 0.5);
    for (const Tensor* t : reads) k.reads.push_back(Range(*t));
    if (write) k.writes.push_back(Range(*write));
    Must(sim_.EnqueueKernel(sim_.ComputeStream(), std::move(k)), "kernel");
  }
  void FillInput(const Tensor& x0) override {
    SimKernel k;
    k.name = "fill input";
    k.writes.push_back(Range(x0));
    Must(sim_.EnqueueKernel(sim_.ComputeStream(), std::move(k)), "kernel");
  }
  void Output(const Tensor&) override {}

 private:
  static SimRange Range(const Tensor& t) {
    return SimRange{t.storage->data(), t.storage->size_bytes()};
  }
  SimBackend& sim_;
  std::array<double, kGemms> ns_;
};

struct SimResult {
  double step_ns = 0;
  int64_t peak_bytes = 0;
  size_t hazards = 0;
};

SimResult SimulateSchedule(const Shape& s, int k,
                           const std::array<double, kGemms>& ns,
                           double d2h_gbps, double h2d_gbps,
                           bool print_trace = false) {
  SimOptions so;
  so.d2h_gbps = d2h_gbps;
  so.h2d_gbps = h2d_gbps;
  so.copy_latency_ns = 0;  // a lower bound: the measured peak, no latency
  so.device_capacity_bytes = int64_t{1} << 40;
  so.pinned_capacity_bytes = int64_t{1} << 40;
  so.store_bytes = false;
  so.record_trace = print_trace;
  SimBackend sim(so);
  SimExec ex(sim, ns);
  OffloadOptions oo;
  oo.model_layers = s.layers;
  oo.offloaded_layers = k;
  auto off = Must(Offloader::Create(sim, oo), "Offloader::Create (sim)");
  std::vector<double> steps;
  for (int it = 0; it < 3; ++it) {
    sim.RunUntilIdle();
    int64_t t0 = sim.NowNs();
    RunStep(ex, *off, s);
    sim.RunUntilIdle();
    steps.push_back(double(sim.NowNs() - t0));
  }
  if (print_trace) {
    // The last step's start/end lines of the compute and copy streams.
    for (const SimTraceEntry& e : sim.trace()) {
      if (e.phase == SimPhase::kEnqueue || e.phase == SimPhase::kHost) {
        continue;
      }
      std::printf("%s\n", e.ToString().c_str());
    }
  }
  SimResult r;
  r.step_ns = steps.back();
  r.peak_bytes = sim.device_memory().peak_bytes;
  r.hazards = sim.hazards().size();
  return r;
}

// ---------------------------------------------------------------------------
// Pinned copy bandwidth with raw cudaMemcpyAsync (GB/s = 1e9 B/s).

struct Bandwidth {
  double d2h = 0, h2d = 0, both_d2h = 0, both_h2d = 0;
};

Bandwidth MeasurePinned(size_t chunk, size_t total) {
  void* host = nullptr;
  void* host2 = nullptr;
  void* dev = nullptr;
  void* dev2 = nullptr;
  Cuda(cudaHostAlloc(&host, chunk, cudaHostAllocDefault), "cudaHostAlloc");
  Cuda(cudaHostAlloc(&host2, chunk, cudaHostAllocDefault), "cudaHostAlloc");
  Cuda(cudaMalloc(&dev, chunk), "cudaMalloc");
  Cuda(cudaMalloc(&dev2, chunk), "cudaMalloc");
  cudaStream_t a, b;
  Cuda(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
  Cuda(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
  cudaEvent_t e[4];
  for (auto& x : e) Cuda(cudaEventCreate(&x), "event");
  const int n = int(std::max<size_t>(1, total / chunk));
  auto run = [&](bool d2h, bool h2d) {
    Cuda(cudaDeviceSynchronize(), "sync");
    cudaEventRecord(e[0], a);
    cudaEventRecord(e[2], b);
    for (int i = 0; i < n; ++i) {
      if (d2h) __real_cudaMemcpyAsync(host, dev, chunk, cudaMemcpyDeviceToHost, a);
      if (h2d) __real_cudaMemcpyAsync(dev2, host2, chunk, cudaMemcpyHostToDevice, b);
    }
    cudaEventRecord(e[1], a);
    cudaEventRecord(e[3], b);
    Cuda(cudaDeviceSynchronize(), "sync");
    float ms_a = 0, ms_b = 0;
    cudaEventElapsedTime(&ms_a, e[0], e[1]);
    cudaEventElapsedTime(&ms_b, e[2], e[3]);
    double bytes = double(chunk) * n;
    return std::pair<double, double>(d2h ? bytes / (ms_a * 1e6) : 0,
                                     h2d ? bytes / (ms_b * 1e6) : 0);
  };
  run(true, true);  // warm-up
  Bandwidth bw;
  std::vector<double> d, h, bd, bh;
  for (int rep = 0; rep < 3; ++rep) {
    d.push_back(run(true, false).first);
    h.push_back(run(false, true).second);
    auto both = run(true, true);
    bd.push_back(both.first);
    bh.push_back(both.second);
  }
  bw.d2h = Median(d);
  bw.h2d = Median(h);
  bw.both_d2h = Median(bd);
  bw.both_h2d = Median(bh);
  for (auto& x : e) cudaEventDestroy(x);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(dev);
  cudaFree(dev2);
  cudaFreeHost(host);
  cudaFreeHost(host2);
  return bw;
}

// ---------------------------------------------------------------------------

struct Flags {
  Shape shape;
  int steps = 5;
  int warmup = 2;
  int kmax = -1;  // default: layers - 2
  // Only the simulator, with made-up GEMM durations (checks the driver
  // without a GPU).
  bool sim_only = false;
  std::vector<double> gemm_ms;  // --gemm_ms=a,b,... (15 values), sim only
  int trace_k = -1;             // --trace_k=K: print the simulator's trace
  // --retain: OffloadOptions::retain_pinned_buffers (TE's
  // retain_pinned_cpu_buffers): pinned buffers kept across steps.
  bool retain = false;
};

double GiB(double b) { return b / double(int64_t{1} << 30); }

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      size_t n = std::strlen(name);
      if (a.compare(0, n, name) == 0 && a.size() > n && a[n] == '=') {
        return a.c_str() + n + 1;
      }
      return nullptr;
    };
    if (const char* v = val("--hidden")) f.shape.hidden = std::atoll(v);
    else if (const char* v = val("--tokens")) f.shape.tokens = std::atoll(v);
    else if (const char* v = val("--layers")) f.shape.layers = std::atoi(v);
    else if (const char* v = val("--steps")) f.steps = std::atoi(v);
    else if (const char* v = val("--warmup")) f.warmup = std::atoi(v);
    else if (const char* v = val("--kmax")) f.kmax = std::atoi(v);
    else if (a == "--sim_only") f.sim_only = true;
    else if (a == "--retain") f.retain = true;
    else if (const char* v = val("--trace_k")) f.trace_k = std::atoi(v);
    else if (const char* v = val("--gemm_ms")) {
      for (const char* p = v; *p;) {
        char* end = nullptr;
        f.gemm_ms.push_back(std::strtod(p, &end));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
      }
    }
    else Die("unknown flag " + a);
  }
  if (f.kmax < 0) f.kmax = f.shape.layers - 2;
  return f;
}

int Main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  const Shape& s = flags.shape;
  if (flags.sim_only) {
    std::array<double, kGemms> ns;
    for (int g = 0; g < kGemms; ++g) {
      ns[g] = g < int(flags.gemm_ms.size()) ? flags.gemm_ms[g] * 1e6 : 1e6;
    }
    for (int k = 0; k <= flags.kmax; ++k) {
      SimResult r =
          SimulateSchedule(s, k, ns, 55.3, 55.4, k == flags.trace_k);
      std::printf("sim k=%d: step %.3f ms, peak %.3f GiB, hazards %zu\n", k,
                  r.step_ns / 1e6, GiB(r.peak_bytes), r.hazards);
    }
    return 0;
  }
  std::unique_ptr<CudaBackend> be =
      Must(NewCudaBackend(CudaOptions{}), "NewCudaBackend");
  if (g_pool == nullptr) Die("the backend's device pool was not seen");
  cudaDeviceProp prop{};
  Cuda(cudaGetDeviceProperties(&prop, be->device()), "props");
  std::printf("# layer_stack_bench: %s, layers %d, hidden %lld, tokens %lld, "
              "bf16 GEMMs (cublasGemmEx, compute 32F)\n",
              prop.name, s.layers, (long long)s.hidden, (long long)s.tokens);
  const int64_t act_per_layer = s.tokens * s.hidden * 2 * 10;
  std::printf("# saved per layer: x, qkv, attn, o, u = %.1f MiB; step "
              "median of %d after %d warm-up\n\n",
              act_per_layer / 1048576.0, flags.steps, flags.warmup);

  // Pinned peak, at the sizes the stack copies.
  const size_t span_small = size_t(s.tokens * s.hidden * 2);  // x, attn, o
  Bandwidth bw_small = MeasurePinned(span_small, size_t{1} << 30);
  Bandwidth bw_16 = MeasurePinned(size_t{16} << 20, size_t{1} << 30);
  Bandwidth bw_big = MeasurePinned(size_t{256} << 20, size_t{2} << 30);
  std::printf("## Pinned copy peak (raw cudaMemcpyAsync, GB/s)\n\n");
  std::printf("| chunk | D2H alone | H2D alone | D2H (both) | H2D (both) |\n");
  std::printf("|---|---|---|---|---|\n");
  auto bwrow = [](const char* name, const Bandwidth& b) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", name, b.d2h, b.h2d,
                b.both_d2h, b.both_h2d);
  };
  bwrow("16 MiB", bw_16);
  char label[64];
  std::snprintf(label, sizeof label, "%.0f MiB", span_small / 1048576.0);
  bwrow(label, bw_small);
  bwrow("256 MiB", bw_big);
  const double peak_d2h = std::max({bw_16.d2h, bw_small.d2h, bw_big.d2h});
  const double peak_h2d = std::max({bw_16.h2d, bw_small.h2d, bw_big.h2d});
  std::printf("\npeak used for the bound: D2H %.1f, H2D %.1f GB/s\n\n",
              peak_d2h, peak_h2d);

  GpuExec ex(*be, s);
  g_copies.compute = ex.stream();
  g_copies.pool.resize(2048);
  for (auto& e : g_copies.pool) Cuda(cudaEventCreate(&e), "event");

  struct Row {
    int k;
    double step_ns, host_ns_per_offloaded, host_ns_per_push;
    uint64_t peak;
    double d2h_gbps, h2d_gbps, d2h_bytes, h2d_bytes;
    size_t copies;
    size_t min_copy;
    double bound_ns;
    int64_t sim_peak;
    size_t hazards;
    bool identical;
    int64_t pinned_slab_allocs;
    double bound_own_ns, fwd_ns, bwd_ns;
    double call_us[kCalls];
  };
  std::vector<Row> rows;
  std::vector<uint64_t> reference;
  std::array<double, kGemms> gemm_ns{};

  for (int k = 0; k <= flags.kmax; ++k) {
    OffloadOptions oo;
    oo.model_layers = s.layers;
    oo.offloaded_layers = k;
    oo.retain_pinned_buffers = flags.retain;
    auto off = Must(Offloader::Create(*be, oo), "Offloader::Create");
    for (int w = 0; w < flags.warmup; ++w) RunStep(ex, *off, s);
    Cuda(cudaDeviceSynchronize(), "sync");
    // Per-GEMM durations, for the bound (k=0), and at every k to see
    // whether the GEMMs run at the same speed next to the copies.
    std::array<double, kGemms> own_ns{};
    {
      std::array<std::vector<double>, kGemms> samples;
      for (int c = 0; c < 3; ++c) {
        ex.StartCalibration();
        RunStep(ex, *off, s);
        ex.EndCalibration(samples);
      }
      for (int g = 0; g < kGemms; ++g) own_ns[g] = Median(samples[g]);
      if (k == 0) gemm_ns = own_ns;
    }
    auto st0 = Must(be->stats(), "stats");
    unsigned long long zero = 0;
    Cuda(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrUsedMemHigh, &zero),
         "reset UsedMemHigh");
    std::vector<double> times, host;
    StepCost cost;
    double call_ns[kCalls] = {};
    int64_t call_count[kCalls] = {};
    int64_t offloaded0 = off->stats().tensors_offloaded;
    for (int i = 0; i < flags.steps; ++i) {
      Cuda(cudaDeviceSynchronize(), "sync");
      Clock::time_point t0 = Clock::now();
      StepCost c = RunStep(ex, *off, s);
      Cuda(cudaDeviceSynchronize(), "sync");
      times.push_back(NsSince(t0));
      host.push_back(c.engine_host_ns);
      cost.pushes += c.pushes;
      for (int q = 0; q < kCalls; ++q) {
        call_ns[q] += c.call_ns[q];
        call_count[q] += c.call_count[q];
      }
    }
    int64_t offloaded = off->stats().tensors_offloaded - offloaded0;
    unsigned long long high = 0;
    Cuda(cudaMemPoolGetAttribute(g_pool, cudaMemPoolAttrUsedMemHigh, &high),
         "UsedMemHigh");
    auto st1 = Must(be->stats(), "stats");

    // One more step with each engine copy timed, and the outputs checked.
    g_copies.records.clear();
    g_copies.next = 0;
    g_copies.overflow = false;
    g_copies.enabled = true;
    ex.set_capture(true);
    RunStep(ex, *off, s);
    Cuda(cudaDeviceSynchronize(), "sync");
    g_copies.enabled = false;
    ex.set_capture(false);
    double d2h_bytes = 0, h2d_bytes = 0, d2h_ms = 0, h2d_ms = 0;
    size_t min_copy = SIZE_MAX;
    for (const CopyRecord& r : g_copies.records) {
      float ms = 0;
      Cuda(cudaEventElapsedTime(&ms, r.start, r.end), "elapsed");
      (r.d2h ? d2h_bytes : h2d_bytes) += double(r.bytes);
      (r.d2h ? d2h_ms : h2d_ms) += ms;
      min_copy = std::min(min_copy, r.bytes);
    }
    if (g_copies.overflow) std::printf("warning: copy event pool overflow\n");
    std::vector<uint64_t> hashes = ex.Hashes();
    if (k == 0) reference = hashes;

    Row row{};
    row.k = k;
    row.step_ns = Median(times);
    double sum_host = 0;
    for (double h : host) sum_host += h;
    row.host_ns_per_offloaded = offloaded ? sum_host / double(offloaded) : 0;
    row.host_ns_per_push = sum_host / double(cost.pushes);
    row.peak = high;
    row.d2h_bytes = d2h_bytes;
    row.h2d_bytes = h2d_bytes;
    row.d2h_gbps = d2h_ms > 0 ? d2h_bytes / (d2h_ms * 1e6) : 0;
    row.h2d_gbps = h2d_ms > 0 ? h2d_bytes / (h2d_ms * 1e6) : 0;
    row.copies = g_copies.records.size();
    row.min_copy = g_copies.records.empty() ? 0 : min_copy;
    row.identical = hashes == reference;
    row.pinned_slab_allocs =
        st1.pinned_slab_allocations - st0.pinned_slab_allocations;
    SimResult sim = SimulateSchedule(s, k, gemm_ns, peak_d2h, peak_h2d);
    row.bound_ns = sim.step_ns;
    row.sim_peak = sim.peak_bytes;
    row.hazards = sim.hazards;
    SimResult sim_own = SimulateSchedule(s, k, own_ns, peak_d2h, peak_h2d);
    row.bound_own_ns = sim_own.step_ns;
    for (int g = 0; g < kGemms; ++g) (g < 5 ? row.fwd_ns : row.bwd_ns) += own_ns[g];
    for (int q = 0; q < kCalls; ++q) {
      row.call_us[q] = call_count[q] ? call_ns[q] / call_count[q] / 1e3 : 0;
    }
    rows.push_back(row);
    std::fprintf(stderr, "k=%d done: step %.2f ms, bound %.2f ms\n", k,
                 row.step_ns / 1e6, row.bound_ns / 1e6);
    for (const std::string& w : off->diagnostics().warnings()) {
      std::fprintf(stderr, "  engine warning: %s\n", w.c_str());
    }
  }

  std::printf("## Per-GEMM compute time (median of 3 steps x %d layers, "
              "k=0)\n\n| GEMM | ms |\n|---|---|\n", s.layers);
  double fwd = 0, bwd = 0;
  for (int g = 0; g < kGemms; ++g) {
    std::printf("| %s | %.3f |\n", kGemmNames[g], gemm_ns[g] / 1e6);
    (g < 5 ? fwd : bwd) += gemm_ns[g];
  }
  std::printf("\nper layer: forward %.3f ms, backward %.3f ms; one layer's "
              "saved bytes take %.3f ms at the D2H peak\n\n",
              fwd / 1e6, bwd / 1e6, act_per_layer / (peak_d2h * 1e6));

  const Row& r0 = rows[0];
  std::printf("## Offloading k of %d layers\n\n", s.layers);
  std::printf("| k | step ms | ratio | act. peak GiB | ratio | D2H GB/s | "
              "H2D GB/s | bound ms | measured/bound | sim peak GiB | "
              "host us/offl. tensor | host us/push | bit-identical |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %.2f | x%.3f | %.2f | x%.2f | %s | %s | %.2f | %.3f | "
                "%.2f | %s | %.2f | %s |\n",
                r.k, r.step_ns / 1e6, r.step_ns / r0.step_ns, GiB(r.peak),
                double(r.peak) / double(r0.peak),
                r.d2h_gbps > 0 ? std::to_string(r.d2h_gbps).substr(0, 5).c_str()
                               : "-",
                r.h2d_gbps > 0 ? std::to_string(r.h2d_gbps).substr(0, 5).c_str()
                               : "-",
                r.bound_ns / 1e6, r.step_ns / r.bound_ns, GiB(r.sim_peak),
                r.k ? std::to_string(r.host_ns_per_offloaded / 1e3)
                          .substr(0, 6)
                          .c_str()
                    : "-",
                r.host_ns_per_push / 1e3, r.identical ? "yes" : "NO");
  }
  std::printf("\n## Bound with each k's own GEMM times, and host cost per "
              "call\n\n| k | fwd ms/layer | bwd ms/layer | bound (own) ms | "
              "measured/bound (own) |");
  for (int q = 0; q < kCalls; ++q) std::printf(" %s us |", kCallNames[q]);
  std::printf("\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %.3f | %.3f | %.2f | %.3f |", r.k, r.fwd_ns / 1e6,
                r.bwd_ns / 1e6, r.bound_own_ns / 1e6,
                r.step_ns / r.bound_own_ns);
    for (int q = 0; q < kCalls; ++q) std::printf(" %.2f |", r.call_us[q]);
    std::printf("\n");
  }
  std::printf("\nD2H/H2D GB/s: bytes / summed duration of the engine's copies"
              " (timed events around each cudaMemcpyAsync on the copy "
              "streams, one extra step). Copies per step and smallest copy:");
  for (const Row& r : rows) {
    std::printf(" k=%d: %zu x >= %.0f MiB (%.2f GiB each way);", r.k,
                r.copies, r.min_copy / 1048576.0, GiB(r.d2h_bytes));
  }
  std::printf("\npinned slabs allocated during the timed steps:");
  for (const Row& r : rows) std::printf(" %lld", (long long)r.pinned_slab_allocs);
  std::printf("\nsimulator hazards:");
  for (const Row& r : rows) std::printf(" %zu", r.hazards);
  std::printf("\n");
  bool ok = true;
  for (const Row& r : rows) ok = ok && r.identical;
  std::printf("\noutputs and all %d weight gradients bit-identical to k=0: "
              "%s\n",
              s.layers * 5, ok ? "yes" : "NO");
  for (auto& e : g_copies.pool) cudaEventDestroy(e);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace offload

int main(int argc, char** argv) { return offload::Main(argc, argv); }
