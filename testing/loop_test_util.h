// A stand-in for autograd driving a TrainingLoop (engine/training_loop.h) on
// the simulated GPU, shared by its unit tests and properties.
//
// A LoopGraph is what autograd's graph holds of one forward: per layer a
// layer-end marker (an IterationRef) and the saved tensors (a LoopSaved for
// those the engine took, the tensor itself for those it kept). Dropping
// the LoopGraph is freeing the graph. LoopHarness::Backward is a backward
// pass reaching layers down to `lowest`: the marker's BackwardStep, then
// each saved tensor popped, its bytes checked, and read by a kernel; without
// `retain` each saved tensor is released once used, as autograd does.
// BackwardLayer is one layer of such a pass, for passes that interleave the
// layers of several graphs.

#ifndef OFFLOAD_TESTING_LOOP_TEST_UTIL_H_
#define OFFLOAD_TESTING_LOOP_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/status.h"
#include "engine/tensor.h"
#include "engine/training_loop.h"
#include "testing/offload_test_util.h"
#include "workload/tensor_util.h"

namespace offload {
namespace loop_test {

struct LoopEntry {
  int layer = 0;
  LoopSaved saved;        // when the engine took it
  Tensor kept;            // when it did not (the graph holds the tensor)
  bool released = false;  // autograd freed it after its use
  std::vector<uint8_t> expected;
};

class LoopGraph {
 public:
  // The layer ids ForwardStep gave, in order (-1: outside offloading).
  const std::vector<int>& layers_seen() const { return layers_; }
  // The highest layer id ForwardStep gave (where a pass begins); -1 if none.
  int top_layer() const {
    int top = -1;
    for (int layer : layers_) top = std::max(top, layer);
    return top;
  }
  uint64_t iteration_id() const {
    for (const IterationRef& marker : markers_) {
      if (!marker.empty()) return marker.id();
    }
    return 0;
  }
  // The part of the graph below `layer` is freed (never reached).
  void DropLayersBelow(int layer) {
    for (LoopEntry& entry : entries_) {
      if (entry.layer < layer) Release(entry);
    }
    for (size_t i = 0; i < markers_.size() && static_cast<int>(i) < layer; ++i) {
      markers_[i] = IterationRef();
    }
  }

 private:
  friend class LoopHarness;
  static void Release(LoopEntry& entry) {
    entry.saved = LoopSaved();
    entry.kept = Tensor();
    entry.released = true;
  }
  std::vector<int> layers_;
  std::vector<IterationRef> markers_;  // per forward position
  std::vector<LoopEntry> entries_;
};

class LoopHarness {
 public:
  LoopHarness(SimBackend& sim, TrainingLoop& loop, int tensors_per_layer = 2)
      : sim_(sim), loop_(loop), per_layer_(tensors_per_layer) {}

  // Runs `layers` layers' forward (ForwardStep(-1) each, as TE's context;
  // with `expected_ids`, ForwardStep(0), ForwardStep(1), ... as a module's
  // pre-hook, so that the first begins a new iteration), each saving
  // tensors_per_layer tensors of 4096 f32 elements. A failure is an empty
  // graph and a failed test expectation at the caller's check.
  LoopGraph Forward(int layers, bool expected_ids = false) {
    LoopGraph graph;
    for (int i = 0; i < layers; ++i) {
      StatusOr<LoopLayer> layer = loop_.ForwardStep(expected_ids ? i : -1);
      if (!layer.ok()) {
        last_error_ = layer.status();
        return graph;
      }
      graph.layers_.push_back(layer->layer);
      graph.markers_.push_back(layer->iteration);
      for (int t = 0; t < per_layer_; ++t) {
        const uint64_t seed = next_seed_++;
        StatusOr<Tensor> tensor =
            offload_test::Produce(sim_, DType::kF32, {64, 64}, seed, 1000);
        if (!tensor.ok()) {
          last_error_ = tensor.status();
          return graph;
        }
        LoopEntry entry;
        entry.layer = layer->layer;
        entry.expected = PatternTensorBytes(*tensor, seed);
        StatusOr<TrainingLoop::Pushed> pushed = loop_.Push(*tensor);
        if (!pushed.ok()) {
          last_error_ = pushed.status();
          return graph;
        }
        if (pushed->kept) {
          entry.kept = *tensor;
        } else {
          entry.saved = std::move(pushed->saved);
        }
        graph.entries_.push_back(std::move(entry));
      }
    }
    return graph;
  }

  // A backward pass over the graph's layers from its top down to `lowest`.
  // Errors: the first failed call, or kInternal for a byte mismatch.
  Status Backward(LoopGraph& graph, int lowest, bool retain) {
    for (int layer = graph.top_layer(); layer >= lowest; --layer) {
      OFFLOAD_RETURN_IF_ERROR(BackwardLayer(graph, layer, retain));
    }
    return OkStatus();
  }

  // One layer of a backward pass: its marker's BackwardStep (if the graph
  // still holds it), then its saved tensors popped in reverse push order,
  // checked and read. A layer the forward never gave is a no-op.
  // Errors: as Backward.
  Status BackwardLayer(LoopGraph& graph, int layer, bool retain) {
    auto at = std::find(graph.layers_.begin(), graph.layers_.end(), layer);
    if (at == graph.layers_.end()) return OkStatus();
    const IterationRef& marker = graph.markers_[at - graph.layers_.begin()];
    if (!marker.empty()) {
      OFFLOAD_RETURN_IF_ERROR(loop_.BackwardStep(marker, layer));
    }
    for (auto it = graph.entries_.rbegin(); it != graph.entries_.rend();
         ++it) {
      LoopEntry& entry = *it;
      if (entry.layer != layer || entry.released) continue;
      Tensor tensor = entry.kept;
      if (entry.kept.storage == nullptr) {
        OFFLOAD_ASSIGN_OR_RETURN(tensor, loop_.Pop(entry.saved, layer));
      }
      OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                               offload_test::HostBytes(sim_, tensor));
      if (bytes != entry.expected) {
        return InternalError("layer " + std::to_string(layer) +
                             ": a popped tensor's bytes differ");
      }
      OFFLOAD_RETURN_IF_ERROR(offload_test::Consume(sim_, {tensor}, 500));
      if (!retain) LoopGraph::Release(entry);
    }
    return OkStatus();
  }

  const Status& last_error() const { return last_error_; }

 private:
  SimBackend& sim_;
  TrainingLoop& loop_;
  const int per_layer_;
  uint64_t next_seed_ = 1;
  Status last_error_ = OkStatus();
};

}  // namespace loop_test
}  // namespace offload

#endif  // OFFLOAD_TESTING_LOOP_TEST_UTIL_H_
