// The call-order rules of the layer front door's steps (engine/offload.h,
// SPEC §4.6) and how messages name a layer, shared by its policies: TE's
// schedules (layer/layer_policy.h) and the byte budget
// (budget/budget_policy.h). Each check changes nothing.

#ifndef OFFLOAD_ENGINE_POLICY_LAYER_STEPS_H_
#define OFFLOAD_ENGINE_POLICY_LAYER_STEPS_H_

#include <string>
#include <vector>

#include "engine/status.h"

namespace offload {

// "layer 3", as every message of the layer front door names a layer.
std::string LayerName(int layer);

// ForwardStep's errors before it does anything: kFailedPrecondition once
// the backward pass of the iteration began, or when all `layers` forwards
// ran. `iteration` names it in messages ("iteration 3").
Status CheckForwardStep(const std::string& iteration, int layers,
                        int forward_count, int backward_count);

// BackwardStep(layer)'s errors before it does anything, prefixed by
// `where`: kInvalidArgument for a layer outside [0, layers);
// kFailedPrecondition if its forward has not run (`forward_count` layers
// did) or its backward already began.
// REQUIRES: backward_begun.size() == layers.
Status CheckBackwardStep(const std::string& where, int layer, int layers,
                         int forward_count,
                         const std::vector<bool>& backward_begun);

// FinishBackward's error before it does anything: kFailedPrecondition if no
// backward step was taken in the iteration.
Status CheckFinishBackward(const std::string& iteration, int backward_count);

// EndTraversal's errors before it does anything (SPEC §7.3), prefixed by
// `where`: kFailedPrecondition without keep_host_copies, or if no backward
// step was taken since the forward (`traversals` == 0) or the last
// traversal.
Status CheckEndTraversal(const std::string& where, bool keep_host_copies,
                         int backward_count, int traversals);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_POLICY_LAYER_STEPS_H_
