#include "workload/layer_loop.h"

#include <string>
#include <utility>

namespace offload {
namespace {

std::string LayerContext(int layer, const char* step) {
  return "layer " + std::to_string(layer) + " " + step;
}

// Error contexts are built only on failure: the loop is timed by benchmarks.

// Calls `call` (an Offloader call) between hooks.before_call and
// hooks.timed.
template <typename F>
auto Call(const LayerLoopHooks& hooks, LayerCall kind, int layer, F&& call) {
  if (hooks.before_call) hooks.before_call(kind, layer);
  if (!hooks.timed) return call();
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  hooks.timed(kind, layer, std::chrono::steady_clock::now() - start);
  return result;
}

}  // namespace

Status RunForwardPass(Offloader& offloader, int layers,
                      const LayerLoopHooks& hooks) {
  for (int layer = 0; layer < layers; ++layer) {
    StatusOr<int> id = Call(hooks, LayerCall::kForwardStep, layer,
                            [&] { return offloader.ForwardStep(); });
    if (!id.ok()) {
      return id.status().WithContext(LayerContext(layer, "ForwardStep"));
    }
    if (*id != layer) {
      return InternalError(LayerContext(layer, "ForwardStep") +
                           " returned layer " + std::to_string(*id));
    }
    Status status = hooks.forward(layer);
    if (!status.ok()) return status.WithContext(LayerContext(layer, "forward"));
  }
  return OkStatus();
}

Status RunBackwardPass(Offloader& offloader, int layers,
                       const LayerLoopHooks& hooks) {
  for (int layer = layers - 1; layer >= 0; --layer) {
    Status status = Call(hooks, LayerCall::kBackwardStep, layer,
                         [&] { return offloader.BackwardStep(layer); });
    if (!status.ok()) {
      return status.WithContext(LayerContext(layer, "BackwardStep"));
    }
    status = hooks.backward(layer);
    if (!status.ok()) {
      return status.WithContext(LayerContext(layer, "backward"));
    }
  }
  return Call(hooks, LayerCall::kFinishBackward, -1,
              [&] { return offloader.FinishBackward(); })
      .WithContext("FinishBackward");
}

Status RunLayerStep(Offloader& offloader, int layers,
                    const LayerLoopHooks& hooks) {
  OFFLOAD_RETURN_IF_ERROR(RunForwardPass(offloader, layers, hooks));
  if (hooks.after_forward) {
    OFFLOAD_RETURN_IF_ERROR(hooks.after_forward().WithContext("after forward"));
  }
  return RunBackwardPass(offloader, layers, hooks);
}

}  // namespace offload
