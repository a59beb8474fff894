#include "bench/stack_limit.h"

namespace offload::bench {

LimitProblem StackLimitProblem(const StackTimeline& t,
                               const std::array<double, kGemms>& gemm_ms,
                               const LimitBandwidth& bandwidth,
                               int64_t budget_bytes, BudgetCounts counts) {
  LimitProblem p;
  for (const StackKernel& k : t.kernels) p.kernel_ms.push_back(gemm_ms[k.gemm]);
  for (const StackTensor& st : t.tensors) {
    LimitTensor lt;
    const bool saved = st.first_backward_reader >= 0;
    lt.bytes = saved || counts == BudgetCounts::kAllActivations ? st.bytes : 0;
    lt.producer = st.producer;
    lt.ready = st.ready;
    lt.free_after =
        st.last_forward_reader >= 0 ? st.last_forward_reader : st.producer;
    lt.needed_at = st.first_backward_reader;
    lt.last_use = st.last_use();
    p.tensors.push_back(lt);
  }
  p.bandwidth = bandwidth;
  p.budget_bytes = budget_bytes;
  return p;
}

}  // namespace offload::bench
