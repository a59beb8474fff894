#include "bench/layer_stack_timeline.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "bench/bench_util.h"
#include "engine/offload.h"

namespace offload::bench {
namespace {

// An Exec that records instead of computing: each tensor by the device
// address of its storage (the simulator never reuses one).
class RecordingExec final : public Exec {
 public:
  explicit RecordingExec(SimBackend& sim) : sim_(sim) {}
  Backend& backend() override { return sim_; }
  void* weight(int) override { return nullptr; }
  void* grad(int, int) override { return nullptr; }
  void* work(int) override { return nullptr; }
  void FillInput(const Tensor& x0) override { Index(x0, -1); }
  void Output(const Tensor&) override {}
  void Run(int id, int layer, const Gemm&, std::vector<const Tensor*> reads,
           const Tensor* write) override {
    const int k = int(timeline_.kernels.size());
    timeline_.kernels.push_back({id, layer});
    for (const Tensor* t : reads) {
      timeline_.tensors[Find(*t)].readers.push_back(k);
    }
    if (write) Index(*write, k);
  }
  StackTimeline& timeline() { return timeline_; }

 private:
  void Index(const Tensor& t, int producer) {
    const void* key = t.storage->data();
    if (index_.count(key)) Die("RecordTimeline: a tensor written twice");
    index_[key] = timeline_.tensors.size();
    StackTensor st;
    st.name = t.name;
    st.bytes = t.storage->size_bytes();
    st.producer = producer;
    timeline_.tensors.push_back(st);
  }
  size_t Find(const Tensor& t) const {
    auto it = index_.find(t.storage->data());
    if (it == index_.end()) Die("RecordTimeline: a read of an unknown tensor");
    return it->second;
  }
  SimBackend& sim_;
  std::map<const void*, size_t> index_;
  StackTimeline timeline_;
};

}  // namespace

StackTimeline RecordTimeline(const Shape& s) {
  SimOptions so;
  so.store_bytes = false;
  so.record_trace = false;
  so.device_capacity_bytes = int64_t{1} << 50;
  SimBackend sim(so);
  StackTimeline t;
  {
    RecordingExec ex(sim);
    OffloadOptions oo;
    oo.model_layers = s.layers;
    oo.offloaded_layers = 0;
    auto off = Must(Offloader::Create(sim, oo), "Offloader::Create");
    RunStep(ex, *off, s);
    sim.RunUntilIdle();
    t = std::move(ex.timeline());
  }
  const std::vector<StackKernel>& ks = t.kernels;
  for (StackTensor& st : t.tensors) {
    for (int r : st.readers) {
      if (ks[r].forward()) {
        st.last_forward_reader = r;
      } else if (st.first_backward_reader < 0) {
        st.first_backward_reader = r;
      }
    }
    st.ready = st.producer;
    if (st.saved() && s.push_at == PushAt::kLayer) {
      // Pushed after the last forward GEMM of the layer that saves it (the
      // layer of its first reader).
      const int layer = ks[st.readers.front()].layer;
      for (int k = 0; k < int(ks.size()); ++k) {
        if (ks[k].forward() && ks[k].layer == layer) st.ready = k;
      }
    }
  }
  return t;
}

int64_t NoOffloadPeakBytes(const StackTimeline& t) {
  int64_t peak = 0;
  for (int k = 0; k < int(t.kernels.size()); ++k) {
    int64_t live = 0;
    for (const StackTensor& st : t.tensors) {
      if (std::max(st.producer, 0) <= k && k <= st.last_use()) {
        live += st.bytes;
      }
    }
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace offload::bench
