#include "bench/layer_stack.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bench/bench_util.h"
#include "bench/layer_gemms.h"
#include "engine/plan/joint_limit.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_problem_of.h"
#include "engine/status.h"
#include "workload/layer_loop.h"

namespace offload::bench {
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

OffloadOptions BenchOptions(const Shape& s, int k, double budget_k,
                            bool retain) {
  OffloadOptions oo;
  oo.model_layers = s.layers;
  oo.offloaded_layers = k;
  oo.retain_pinned_buffers = retain;
  if (budget_k >= 0) oo.activation_budget_bytes = BudgetForK(s, budget_k);
  return oo;
}

RecomputeOptions StackRecompute(const Shape& s,
                                const std::array<double, kGemms>& ns,
                                double d2h_gbps, double h2d_gbps) {
  const int64_t th = s.tokens * s.hidden * 2;  // bf16 [T,H]
  UnitCost layer;
  layer.saved_bytes = SavedBytesPerLayer(s);
  for (int g = 0; g < kGemms; ++g) {
    (g < 5 ? layer.forward_ns : layer.backward_ns) += ns[g];
    if (g < 4) layer.recompute_ns += ns[g];
  }
  layer.recomputable = true;
  layer.input_bytes = th;
  layer.recompute_bytes = 9 * th;
  RecomputeOptions rc;
  rc.layers.assign(s.layers, layer);
  rc.d2h_gbps = d2h_gbps;
  rc.h2d_gbps = h2d_gbps;
  return rc;
}

bool RowOptions(Shape& s, RowMode mode, double budget_k,
                const std::array<double, kGemms>& gemm_ns, double d2h_gbps,
                double h2d_gbps, bool retain, OffloadOptions* options,
                std::string* plan_text) {
  switch (mode) {
    case RowMode::kLayers:
      *options = BenchOptions(s, 0, -1, retain);
      return true;
    case RowMode::kBudget:
      *options = BenchOptions(s, 0, budget_k, retain);
      return true;
    case RowMode::kJoint:
      *options = BenchOptions(s, 0, budget_k, retain);
      options->recompute = StackRecompute(s, gemm_ns, d2h_gbps, h2d_gbps);
      return true;
    case RowMode::kCheckpoint: {
      OffloadOptions planned = BenchOptions(s, 0, budget_k, retain);
      planned.recompute = StackRecompute(s, gemm_ns, d2h_gbps, h2d_gbps);
      planned.recompute->allow_offload = false;
      const JointProblem problem = JointProblemOf(planned);
      StatusOr<JointPlan> plan = PlanJoint(problem);
      if (!plan.ok()) {
        std::fprintf(stderr, "ckpt k=%g: no plan: %s\n", budget_k,
                     plan.status().ToString().c_str());
        return false;
      }
      s.checkpointed.assign(s.layers, false);
      for (int l = 0; l < s.layers; ++l) s.checkpointed[l] = plan->Recompute(l);
      *plan_text = FormatJointPlan(*plan, problem);
      *options = BenchOptions(s, 0, -1, retain);  // nothing offloaded
      return true;
    }
  }
  return false;
}

StatusOr<JointRowLimit> JointRowLimitOf(const OffloadOptions& options) {
  const JointProblem problem = JointProblemOf(options);
  StatusOr<JointPlan> plan = PlanJoint(problem);
  if (!plan.ok()) return plan.status();
  StatusOr<JointLimitResult> limit = JointLimit(problem);
  if (!limit.ok()) return limit.status();
  return JointRowLimit{plan->step_ns, limit->step_ns};
}

const char* PushAtName(PushAt p) {
  return p == PushAt::kLayer ? "layer" : "gemm";
}

void* Ptr(const Tensor& t) {
  return static_cast<char*>(t.storage->data()) + t.offset * t.element_size();
}

StepCost RunStep(Exec& ex, Offloader& off, const Shape& s) {
  Backend& be = ex.backend();
  const int64_t T = s.tokens, H = s.hidden;
  StepCost cost;
  auto add_cost = [&](Call call, double ns) {
    cost.engine_host_ns += ns;
    cost.call_ns[call] += ns;
    cost.call_count[call] += 1;
  };
  auto timed_call = [&](Call call, auto&& f) {
    Clock::time_point t0 = Clock::now();
    auto r = f();
    add_cost(call, NsSince(t0));
    return r;
  };
  struct Saved {
    SavedTensor x, qkv, attn, o, u;
  };
  std::vector<Saved> saved(s.layers);

  LayerLoopHooks hooks;
  // The driver times ForwardStep, BackwardStep and FinishBackward around the
  // call alone, as timed_call does for Push and Pop.
  hooks.timed = [&](LayerCall call, int /*layer*/, Clock::duration took) {
    const Call kind = call == LayerCall::kForwardStep    ? kForwardStep
                      : call == LayerCall::kBackwardStep ? kBackwardStep
                                                         : kFinishBackward;
    add_cost(kind, std::chrono::duration<double, std::nano>(took).count());
  };

  Tensor x = NewActivation(be, T, H, "x0");
  ex.FillInput(x);
  const bool per_gemm = s.push_at == PushAt::kGemm;
  auto push = [&](const Tensor& t, const char* what) {
    cost.pushes += 1;
    return Must(timed_call(kPush, [&] { return off.Push(t); }), what);
  };
  // A recomputed layer (the Offloader's plan, SPEC §4.8, or
  // Shape::checkpointed) saves only its input; its other tensors go as soon
  // as the next GEMM is enqueued, and its backward re-runs GEMMs 0..3.
  auto recomputed = [&](int i) { return Recomputed(s, i, &off); };
  hooks.forward = [&](int i) {
    Saved& sv = saved[i];
    const bool rc = recomputed(i);
    // Per GEMM: each tensor is pushed as soon as its producer is enqueued
    // (x is the layer's input, produced already), so Push records its
    // ready point right after that GEMM on the compute stream.
    if (per_gemm || rc) sv.x = push(x, "Push x");
    Tensor qkv = ForwardGemm(ex, s, 0, i, x);
    if (per_gemm && !rc) sv.qkv = push(qkv, "Push qkv");
    Tensor attn = ForwardGemm(ex, s, 1, i, qkv);
    if (rc) qkv = Tensor();
    if (per_gemm && !rc) sv.attn = push(attn, "Push attn");
    Tensor o = ForwardGemm(ex, s, 2, i, attn);
    if (rc) attn = Tensor();
    if (per_gemm && !rc) sv.o = push(o, "Push o");
    Tensor u = ForwardGemm(ex, s, 3, i, o);
    if (rc) o = Tensor();
    if (per_gemm && !rc) sv.u = push(u, "Push u");
    Tensor y = ForwardGemm(ex, s, 4, i, u);
    if (!per_gemm && !rc) {  // --push_at=layer: all five after the last GEMM
      sv.x = push(x, "Push x");
      sv.qkv = push(qkv, "Push qkv");
      sv.attn = push(attn, "Push attn");
      sv.o = push(o, "Push o");
      sv.u = push(u, "Push u");
    }
    x = std::move(y);  // drops this layer's other tensors
    return OkStatus();
  };
  hooks.after_forward = [&] {
    ex.Output(x);
    x = Tensor();
    return OkStatus();
  };

  void* dy = ex.work(0);
  hooks.backward = [&](int i) {
    Saved& sv = saved[i];
    const LayerGradients d = GradientsOf(ex, i, dy);
    // As autograd, which releases a node's saved tensors once the node's
    // backward ran: the handle goes with its pop (the popped tensor lives
    // until its GEMM is enqueued).
    auto pop = [&](SavedTensor& st) {
      Tensor t = Must(timed_call(kPop, [&] { return off.Pop(st); }), "Pop");
      st = SavedTensor();
      return t;
    };
    // A recomputed layer: its input popped, its forward GEMMs 0..3 re-run
    // (the same GEMMs on the same bytes: the same results), their outputs
    // used below in place of pops.
    struct Recomputed {
      Tensor x, qkv, attn, o, u;
    };
    std::optional<Recomputed> rc;
    if (recomputed(i)) {
      rc.emplace();
      rc->x = pop(sv.x);
      rc->qkv = ForwardGemm(ex, s, 0, i, rc->x);
      rc->attn = ForwardGemm(ex, s, 1, i, rc->qkv);
      rc->o = ForwardGemm(ex, s, 2, i, rc->attn);
      rc->u = ForwardGemm(ex, s, 3, i, rc->o);
    }
    // The saved tensor: recomputed (handed over: dropped after its GEMM as
    // a popped one is) or popped.
    auto take = [&](SavedTensor& st, Tensor Recomputed::*field) {
      return rc.has_value() ? std::move((*rc).*field) : pop(st);
    };
    // Per forward GEMM g = 4..0 (GEMMs 5..14): the input gradient, then g's
    // input (popped or recomputed) for the weight gradient, dropped after it.
    SavedTensor Saved::*const saved_input[kForwardGemms] = {
        &Saved::x, &Saved::qkv, &Saved::attn, &Saved::o, &Saved::u};
    Tensor Recomputed::*const recomputed_input[kForwardGemms] = {
        &Recomputed::x, &Recomputed::qkv, &Recomputed::attn, &Recomputed::o,
        &Recomputed::u};
    for (int g = kForwardGemms - 1; g >= 0; --g) {
      InputGradGemm(ex, s, g, i, d.d_out[g], d.d_in[g]);
      Tensor in = take(sv.*saved_input[g], recomputed_input[g]);
      WeightGradGemm(ex, s, g, i, in, d.d_out[g]);
    }
    sv = Saved();
    dy = d.d_in[0];
    return OkStatus();
  };
  // Push and Pop die in the hooks; the driver's own calls (and an unexpected
  // layer id) die here, with the layer and the call in the message.
  Must(RunLayerStep(off, s.layers, hooks), "step");
  return cost;
}

CapturedStep CaptureStep(Exec& ex, Offloader& off, const Shape& s, int warmup,
                         CaptureMode mode) {
  if (warmup < 1) Die("CaptureStep: at least one warm-up step is needed");
  Must(off.BeginWarmup(), "Offloader::BeginWarmup");
  for (int w = 0; w < warmup; ++w) RunStep(ex, off, s);
  Must(off.EndWarmup(), "Offloader::EndWarmup");
  CapturedStep c;
  const Clock::time_point t0 = Clock::now();
  Must(off.BeginCapture(mode), "Offloader::BeginCapture");
  c.cost = RunStep(ex, off, s);
  c.graph = Must(off.EndCapture(), "Offloader::EndCapture");
  c.capture_ns = NsSince(t0);
  return c;
}

}  // namespace offload::bench
