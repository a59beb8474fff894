// A layer stack's training step on the simulator, written so that it can be
// captured into a graph (SPEC §5.7) and launched many times with new inputs.
//
// The step's loop (ForwardStep .. FinishBackward) is workload/layer_loop.h's
// RunLayerStep, as for the workload driver (workload/workload.h) and the
// benchmark's step (bench/layer_stack.h, RunStep); this file adds only what
// those two cannot do: kernels whose bodies write and check bytes when they
// run, so a replayed graph is checked per launch (the workload driver checks
// on the host after a synchronization, which a capture cannot contain; the
// benchmark's GEMMs check nothing), and the Offloader's manual calls
// (GraphStepSpec::manual).
//
// Nothing in it waits on the host or touches pinned memory: forward kernels
// write each saved tensor when they run, with bytes drawn from the epoch
// that GraphStepInputs holds *at that device time*; backward kernels compare
// each popped tensor, when they run, with the bytes of that epoch. So the
// host sets a new epoch before each launch (as a CUDA-graph user copies new
// inputs into the graph's static input buffers), and the checks see whether
// every replayed reload brought back this launch's bytes.
//
//   GraphStepInputs inputs;
//   ASSERT_OK(EnqueueGraphStep(sim, offloader, spec, inputs));  // eager
//   sim.RunUntilIdle();
//   EXPECT_EQ(inputs.checked_bytes(), spec.CheckedBytes());
//   EXPECT_THAT(inputs.mismatches(), IsEmpty());

#ifndef OFFLOAD_TESTING_GRAPH_STEP_H_
#define OFFLOAD_TESTING_GRAPH_STEP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/status.h"

namespace offload {

struct GraphStepSpec {
  // Per layer, the bytes of each saved tensor (u8, contiguous, one storage
  // each; the first is saved twice when `repeat_first`).
  std::vector<std::vector<int64_t>> saves;
  bool repeat_first = false;
  int64_t forward_ns = 100'000;   // per layer
  int64_t backward_ns = 200'000;  // per layer
  // Drive the Offloader's manual calls (it must be made with
  // manual_synchronization): layers [0, manual_offloaded) are offloaded;
  // layer l starts its offload after its pushes, releases its memory at the
  // forward of l + 2 (or at the first backward step), and is reloaded at the
  // backward of l + 1.
  bool manual = false;
  int manual_offloaded = 0;

  int layers() const { return static_cast<int>(saves.size()); }
  // Bytes the backward kernels compare in one step.
  int64_t CheckedBytes() const;
  // Bytes saved by `layer` (its storages).
  int64_t LayerBytes(int layer) const;
};

// What the kernels of a step read and write on the host: the epoch of the
// inputs, and what the checks found.
class GraphStepInputs {
 public:
  void set_epoch(uint64_t epoch) { state_->epoch = epoch; }
  uint64_t epoch() const { return state_->epoch; }
  int64_t checked_bytes() const { return state_->checked_bytes; }
  const std::vector<std::string>& mismatches() const {
    return state_->mismatches;
  }
  void ResetChecks() {
    state_->checked_bytes = 0;
    state_->mismatches.clear();
  }

  // Shared with the kernel bodies (which outlive a step and run on replay).
  struct State {
    uint64_t epoch = 0;
    int64_t checked_bytes = 0;
    std::vector<std::string> mismatches;
  };
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Enqueues one iteration (ForwardStep ... FinishBackward) of `spec` through
// `offloader` on `sim`'s compute stream: per layer a forward kernel writing
// the layer's saved tensors, pushed and dropped; in backward, pops and a
// kernel reading (and checking) them. Device memory is allocated and freed
// on the compute stream within the iteration.
// Errors: kInvalidArgument for an empty spec or a size <= 0; what the
//   Offloader or the simulator return, with the layer and call as
//   RunLayerStep names them ("layer 3 forward: StartOffload of layer 3: ...").
Status EnqueueGraphStep(SimBackend& sim, Offloader& offloader,
                        const GraphStepSpec& spec, GraphStepInputs& inputs);

}  // namespace offload

#endif  // OFFLOAD_TESTING_GRAPH_STEP_H_
