// What the caller declares about one unit (a layer) of the joint plan of
// SPEC §4.8: OffloadOptions::recompute's layers (engine/offload_options.h)
// and JointProblem's units (engine/plan/joint_plan.h, whose header gives
// the model these figures feed). Pure data, in the public API because the
// options carry it; the plans that read it are in engine/plan/.

#ifndef OFFLOAD_ENGINE_UNIT_COST_H_
#define OFFLOAD_ENGINE_UNIT_COST_H_

#include <cstdint>

namespace offload {

// One unit's figures, checked by ValidateJointProblem
// (engine/plan/joint_plan.h).
struct UnitCost {
  int64_t saved_bytes = 0;      // saved for backward when not recomputed
  double forward_ns = 0;
  double backward_ns = 0;
  bool recomputable = false;
  // false: never offloaded (bytes outside the caller's units that must stay
  // on device, such as the transient of a model's head at the forward's
  // end: a last unit with no backward time whose bytes are gone once the
  // backward begins).
  bool offloadable = true;
  // When recomputed: the bytes it still saves (its input), the forward it
  // re-runs before its backward, and the bytes that re-run re-creates and
  // holds until the unit's backward ends (may exceed saved_bytes, what the
  // unit leaves once the next one begins: the re-run holds what its forward
  // left at its own end, before the code after it freed its input).
  int64_t input_bytes = 0;
  double recompute_ns = 0;
  int64_t recompute_bytes = 0;
  // Bytes the unit holds only for a moment, above what the model already
  // counts on device then: at the peak of its forward (and of its re-run
  // when recomputed; an eager attention's score matrix, freed before the
  // forward ends), and at the peak of its backward (the temporaries and
  // gradients it computes). Neither stays after the unit ends.
  int64_t forward_transient_bytes = 0;
  int64_t backward_transient_bytes = 0;
  // What a unit recomputed in full holds at its forward's peak above its
  // input, where measured (at least; 0: nothing more than the forward
  // transient above). Nothing of its forward is saved, but its
  // intermediates live while it runs: 592 MiB on the Llama layer,
  // where kept it holds 192 above all it saves. The model takes the larger
  // of it and forward_transient_bytes (joint_model.h: ForwardTransient).
  int64_t recompute_forward_transient_bytes = 0;
  // Selective recompute (a kind of recompute: needs `recomputable` and the
  // problem's allow_recompute; its saved tensors live in the checkpoint's
  // own storage, and go to host where the plan makes it selective-offload,
  // engine/plan/joint_plan.h). When chosen the unit saves
  // selective_bytes (its input and the kept outputs; 0 < selective_bytes <=
  // saved_bytes) in the forward; before its backward it re-runs its cheap
  // ops in selective_ns (>= 0), re-creating saved_bytes - selective_bytes,
  // held until its backward ends. Ignored where `selective` is false.
  bool selective = false;
  int64_t selective_bytes = 0;
  double selective_ns = 0;
  // What a selective unit holds for a moment beyond those, where measured
  // (at least; 0: nothing more than the transients above): at the peak of
  // its forward, above its selective_bytes (the cheap ops' outputs alive
  // until the costly op that reads them), and at the peak of its backward,
  // above what its re-run re-creates (the re-run's temporaries beside the
  // backward's). The model takes the larger of each and the transient
  // above (engine/plan/joint_model.h: ForwardTransient, BackwardTransient).
  int64_t selective_forward_transient_bytes = 0;
  int64_t selective_backward_transient_bytes = 0;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_UNIT_COST_H_
