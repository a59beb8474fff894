#include "bench/layer_gemms.h"

namespace offload::bench {

Tensor ForwardGemm(Exec& ex, const Shape& s, int g, int layer,
                   const Tensor& in) {
  const int64_t T = s.tokens, H = s.hidden;
  Tensor out =
      NewActivation(ex.backend(), T, kGemmOut[g] * H, kGemmOutNames[g]);
  ex.Run(g, layer,
         {false, false, T, kGemmOut[g] * H, kGemmIn[g] * H, Ptr(in),
          ex.weight(g), Ptr(out)},
         {&in}, &out);
  return out;
}

LayerGradients GradientsOf(Exec& ex, int layer, void* dy) {
  // dqkv, dattn, d_o, du, dy and dx, dqkv, dattn, d_o, du.
  void* dx = ex.work(layer % 2 ? 1 : 2);
  return LayerGradients{
      {ex.work(6), ex.work(5), ex.work(4), ex.work(3), dy},
      {dx, ex.work(6), ex.work(5), ex.work(4), ex.work(3)}};
}

void InputGradGemm(Exec& ex, const Shape& s, int g, int layer, void* d_out,
                   void* d_in) {
  const int64_t T = s.tokens, H = s.hidden;
  const int back = 5 + 2 * (kForwardGemms - 1 - g);  // kGemmNames
  ex.Run(back, layer,
         {false, true, T, kGemmIn[g] * H, kGemmOut[g] * H, d_out, ex.weight(g),
          d_in},
         {}, nullptr);
}

void WeightGradGemm(Exec& ex, const Shape& s, int g, int layer,
                    const Tensor& in, void* d_out) {
  const int64_t T = s.tokens, H = s.hidden;
  const int back = 5 + 2 * (kForwardGemms - 1 - g);
  ex.Run(back + 1, layer,
         {true, false, kGemmIn[g] * H, kGemmOut[g] * H, T, Ptr(in), d_out,
          ex.grad(layer, g)},
         {&in}, nullptr);
}

}  // namespace offload::bench
