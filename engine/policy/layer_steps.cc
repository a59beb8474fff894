#include "engine/policy/layer_steps.h"

#include <string>
#include <vector>

namespace offload {

std::string LayerName(int layer) { return "layer " + std::to_string(layer); }

Status CheckForwardStep(const std::string& iteration, int layers,
                        int forward_count, int backward_count) {
  if (backward_count > 0) {
    return FailedPreconditionError(
        "ForwardStep in " + iteration + ": the backward pass began; "
        "call FinishBackward before the next forward");
  }
  if (forward_count == layers) {
    return FailedPreconditionError(
        "ForwardStep in " + iteration + ": all " + std::to_string(layers) +
        " layers already ran forward; call BackwardStep and FinishBackward "
        "first");
  }
  return OkStatus();
}

Status CheckBackwardStep(const std::string& where, int layer, int layers,
                         int forward_count,
                         const std::vector<bool>& backward_begun) {
  if (layer < 0 || layer >= layers) {
    return InvalidArgumentError(where + ": no such layer in a model of " +
                                std::to_string(layers) + " layers");
  }
  if (layer >= forward_count) {
    return FailedPreconditionError(
        where + ": its forward has not run (" + std::to_string(forward_count) +
        " layers ran forward)");
  }
  if (backward_begun[layer]) {
    return FailedPreconditionError(where + ": its backward already began");
  }
  return OkStatus();
}

Status CheckEndTraversal(const std::string& where, bool keep_host_copies,
                         int backward_count, int traversals) {
  if (!keep_host_copies) {
    return FailedPreconditionError(
        where + ": needs keep_host_copies (without it each group's host copy "
                "goes once its backward is done)");
  }
  if (backward_count == 0) {
    return FailedPreconditionError(
        where + ": no BackwardStep since the " +
        (traversals == 0 ? "forward" : "last traversal"));
  }
  return OkStatus();
}

Status CheckFinishBackward(const std::string& iteration, int backward_count) {
  if (backward_count == 0) {
    return FailedPreconditionError("FinishBackward in " + iteration +
                                   ": no backward step was taken");
  }
  return OkStatus();
}

}  // namespace offload
