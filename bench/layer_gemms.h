// The layer stack's GEMMs (layer_stack.h) by forward GEMM, for the steps of
// both front doors: RunStep (the Offloader, layer_stack.h) and
// RunPipelineSchedule (the PipelineOffloader, pipeline_step.h) run the same
// 15 GEMMs per layer on the same shapes; only the offloader calls between
// them differ.
//
// Forward GEMM g (0 qkv, 1 attn, 2 o, 3 up, 4 down) reads [T, kGemmIn[g]·H]
// and writes [T, kGemmOut[g]·H]. Its backward is two GEMMs: the input
// gradient (GEMM 5 + 2·(4 - g)) and the weight gradient (the next one),
// which reads g's saved input.

#ifndef OFFLOAD_BENCH_LAYER_GEMMS_H_
#define OFFLOAD_BENCH_LAYER_GEMMS_H_

#include <cstdint>

#include "bench/layer_stack.h"
#include "engine/tensor.h"

namespace offload::bench {

inline constexpr int kForwardGemms = 5;
inline constexpr int64_t kGemmIn[kForwardGemms] = {1, 3, 1, 1, 4};
inline constexpr int64_t kGemmOut[kForwardGemms] = {3, 1, 1, 4, 1};
// The activation each forward GEMM writes (NewActivation's name).
inline constexpr const char* kGemmOutNames[kForwardGemms] = {"qkv", "attn", "o",
                                                             "u", "y"};

// Enqueues forward GEMM g of `layer` reading `in`, and returns what it
// writes: a new activation [T, kGemmOut[g]·H]. Dies if the allocation fails.
// REQUIRES: 0 <= g < kForwardGemms; `in` is [T, kGemmIn[g]·H].
Tensor ForwardGemm(Exec& ex, const Shape& s, int g, int layer,
                   const Tensor& in);

// The gradient buffers of one layer's backward: the gradient of forward GEMM
// g's output (d_out[g], read) and of its input (d_in[g], written). d_out[4]
// is `dy`, the gradient of the layer's output; d_in[0] is the layer's input
// gradient (the next layer's dy), ping-ponging between two work buffers.
struct LayerGradients {
  void* d_out[kForwardGemms];
  void* d_in[kForwardGemms];
};
LayerGradients GradientsOf(Exec& ex, int layer, void* dy);

// Enqueues the input gradient of forward GEMM g of `layer`:
// d_in = d_out · W_g^T ([T, out] x [out, in]).
void InputGradGemm(Exec& ex, const Shape& s, int g, int layer, void* d_out,
                   void* d_in);

// Enqueues the weight gradient of forward GEMM g of `layer`, reading `in`
// (g's saved input, popped or recomputed): dW_g = in^T · d_out
// ([in, T] x [T, out]), overwritten, not accumulated.
void WeightGradGemm(Exec& ex, const Shape& s, int g, int layer,
                    const Tensor& in, void* d_out);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_LAYER_GEMMS_H_
