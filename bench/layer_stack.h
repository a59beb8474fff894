// The workload of the layer-stack benchmark, independent of the device: a
// stack of transformer-block-like layers whose activations go through the
// Offloader. An Exec runs its GEMMs, on the real GPU (gpu_exec.h) or on the
// simulator (sim_bound.h).
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
// Forward pushes (Shape::push_at): by default each saved tensor is pushed
// as autograd saves it, right after the GEMM that produces it is enqueued
// (x, the layer's input, before the qkv GEMM; qkv after GEMM 0, attn after
// 1, o after 2, u after 3), so its ready point (the event Push records on
// the compute stream) is that GEMM's end. PushAt::kLayer pushes all five
// after the layer's last forward GEMM (the benchmark before issue 11).

#ifndef OFFLOAD_BENCH_LAYER_STACK_H_
#define OFFLOAD_BENCH_LAYER_STACK_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload::bench {

// Where the forward pushes a layer's saved tensors (--push_at).
enum class PushAt {
  kGemm,   // each after the GEMM that produces it (x before the first)
  kLayer,  // all five after the layer's five forward GEMMs
};

// "gemm" or "layer", as --push_at spells it.
const char* PushAtName(PushAt p);

// The workload: the stack's size and where its forward pushes.
struct Shape {
  int layers = 8;
  int64_t hidden = 4096;
  int64_t tokens = 8192;
  PushAt push_at = PushAt::kGemm;
  // Layers the step recomputes whatever the Offloader says (checkpointing,
  // the --ckpt_k rows); empty: none. The Offloader's plan adds its own
  // (Offloader::Recompute, SPEC §4.8). A recomputed layer pushes only x;
  // its backward pops x and re-runs GEMMs 0..3 before GEMMs 5..14.
  std::vector<bool> checkpointed;
};

// Whether the step recomputes layer i: the shape checkpoints it
// (Shape::checkpointed) or the plan does (`recompute(i)`, the Offloader's or
// PlanJoint's, SPEC §4.8; null: none).
template <typename Recompute>
bool Recomputed(const Shape& s, int i, const Recompute* plan) {
  return (i < int(s.checkpointed.size()) && s.checkpointed[i]) ||
         (plan != nullptr && plan->Recompute(i));
}

// How many of the shape's layers Recomputed counts.
template <typename Recompute>
int RecomputedLayers(const Shape& s, const Recompute* plan) {
  int n = 0;
  for (int i = 0; i < s.layers; ++i) n += Recomputed(s, i, plan);
  return n;
}

// Forward GEMMs 0..4, backward GEMMs 5..14 (see the comment at the top).
inline constexpr int kGemms = 15;
inline constexpr const char* kGemmNames[kGemms] = {
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

// The address of `t`'s first element.
void* Ptr(const Tensor& t);

// A contiguous bf16 [rows, cols] activation allocated on the compute
// stream. Dies if the allocation fails.
Tensor NewActivation(Backend& be, int64_t rows, int64_t cols,
                     const std::string& name);

// The bytes a layer saves (x, qkv, attn, o, u: 10 T*H bf16 elements).
inline int64_t SavedBytesPerLayer(const Shape& s) {
  return s.tokens * s.hidden * 2 * 10;
}

// The byte budget equal to what TE's k-of-n keeps resident at k = `k`
// (SPEC §4.1: layers - k layers' saved bytes); k may be fractional.
inline int64_t BudgetForK(const Shape& s, double k) {
  return int64_t((s.layers - k) * double(SavedBytesPerLayer(s)));
}

// What a layer costs, for the joint plan (SPEC §4.8): it saves
// SavedBytesPerLayer; recomputed it keeps x (T*H bf16) and re-creates qkv,
// attn, o, u (9 T*H) by GEMMs 0..3; forward GEMMs 0..4, backward 5..14, at
// the durations `ns`; copies at the given GB/s.
RecomputeOptions StackRecompute(const Shape& s,
                                const std::array<double, kGemms>& ns,
                                double d2h_gbps, double h2d_gbps);

// Offloader options of the benchmark: k of n layers (budget_k < 0), or the
// byte budget BudgetForK(budget_k).
OffloadOptions BenchOptions(const Shape& s, int k, double budget_k,
                            bool retain);

// What a row runs: TE's k of n layers, the byte budget (SPEC §4.7), the
// joint plan (§4.8), or recomputation alone (checkpointing).
enum class RowMode { kLayers, kBudget, kJoint, kCheckpoint };
inline const char* RowModeName(RowMode m) {
  return m == RowMode::kLayers   ? "layers"
         : m == RowMode::kBudget ? "budget"
         : m == RowMode::kJoint  ? "joint"
                                 : "ckpt";
}

// The Offloader options of a row (the k of a kLayers row is set by the
// caller), and for a kCheckpoint row the layers `s` recomputes
// (Shape::checkpointed, from PlanJoint without offloading) and that plan as
// text. `gemm_ns` and the bandwidths are the layer costs of the joint plan.
// Returns false (printed to stderr) when no checkpoint plan fits.
bool RowOptions(Shape& s, RowMode mode, double budget_k,
                const std::array<double, kGemms>& gemm_ns, double d2h_gbps,
                double h2d_gbps, bool retain, OffloadOptions* options,
                std::string* plan_text);

// A joint row's plan next to its limit (engine/plan/joint_limit.h), from the
// same layer costs: the step the plan's model predicts, and the least step
// any keep / offload / recompute choice of the same layers can have within
// the budget. Errors: the planner's and the limit's (no plan fits; more
// than kJointLimitMaxUnits layers).
// REQUIRES: `options` has a recompute declaration (RowOptions, kJoint).
struct JointRowLimit {
  double plan_ns = 0;
  double limit_ns = 0;
};
StatusOr<JointRowLimit> JointRowLimitOf(const OffloadOptions& options);

// Offloader calls, for the host-cost breakdown.
enum Call { kForwardStep, kPush, kBackwardStep, kPop, kFinishBackward, kCalls };
inline constexpr const char* kCallNames[kCalls] = {
    "ForwardStep", "Push", "BackwardStep", "Pop", "FinishBackward"};

struct StepCost {
  double engine_host_ns = 0;  // wall time inside Offloader calls
  int64_t pushes = 0;
  double call_ns[kCalls] = {};
  int64_t call_count[kCalls] = {};
};

// One training step (forward over all layers, then backward) through `off`,
// on `ex`. Dies on any engine error. Every device allocation of the step is
// freed within it, and nothing in it waits on the host, so it can be
// captured whole (CaptureStep).
StepCost RunStep(Exec& ex, Offloader& off, const Shape& s);

// One step captured into a graph (SPEC §5.7): `warmup` >= 1 warm-up steps
// through `off` (Offloader::BeginWarmup .. EndWarmup: nothing offloaded, the
// pinned memory of each offload recorded), then Offloader::BeginCapture, one
// RunStep, EndCapture. Nothing of the captured step runs until the graph is
// launched (Backend::Instantiate, Backend::Launch on the compute stream);
// each launch runs its GEMMs, copies, record/wait orderings and device
// allocations with no host work. `off` must outlive the graph's execs (they
// use its pinned buffers). Dies on any engine error (e.g. a byte budget,
// which cannot be captured).
struct CapturedStep {
  std::unique_ptr<Graph> graph;
  StepCost cost;          // the Offloader calls of the captured step
  double capture_ns = 0;  // host wall time of BeginCapture .. EndCapture
};
CapturedStep CaptureStep(Exec& ex, Offloader& off, const Shape& s, int warmup,
                         CaptureMode mode = CaptureMode::kGlobal);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_LAYER_STACK_H_
