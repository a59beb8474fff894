#include "engine/schedule.h"

#include <string>

namespace offload {

int ScheduleStep(int layers, bool forward, int count) {
  return forward ? count : layers + count;
}

StatusOr<ScheduleTable> DefaultSchedule(int layers, int offloaded) {
  if (layers > kMaxModelLayers) {
    return InvalidArgumentError("default schedule: " + std::to_string(layers) +
                                " layers; at most " +
                                std::to_string(kMaxModelLayers));
  }
  if (offloaded < 0 || offloaded > layers - 1) {
    return InvalidArgumentError(
        "default schedule: " + std::to_string(offloaded) +
        " offloaded layers of " + std::to_string(layers) +
        "; at most model_layers - 1 = " + std::to_string(layers - 1) +
        " can be offloaded");
  }
  ScheduleTable table;
  for (int i = 0; i < offloaded; ++i) {
    // Released when layer n-k+i begins its forward: n-k+i+1 layers have.
    // Reloaded when layer n-1-k+i begins its backward: k-i+1 layers have.
    table[i] = ScheduleEntry{/*offload_fwd=*/true, layers - offloaded + i + 1,
                             /*reload_fwd=*/false, offloaded - i + 1};
  }
  return table;
}

Status ValidateSchedule(const ScheduleTable& table, int layers) {
  if (layers < 1 || layers > kMaxModelLayers) {
    return InvalidArgumentError("schedule table for " + std::to_string(layers) +
                                " layers: a model has 1 to " +
                                std::to_string(kMaxModelLayers) + " layers");
  }
  for (const auto& [layer, entry] : table) {
    std::string where = "schedule table, layer " + std::to_string(layer) + ": ";
    if (layer < 0 || layer >= layers) {
      return InvalidArgumentError(where + "no such layer in a model of " +
                                  std::to_string(layers) + " layers");
    }
    if (entry.offload_num < 1 || entry.offload_num > layers ||
        entry.reload_num < 1 || entry.reload_num > layers) {
      return InvalidArgumentError(where + "offload_num and reload_num must be "
                                  "in [1, " + std::to_string(layers) + "]");
    }
    int release = ScheduleStep(layers, entry.offload_fwd, entry.offload_num);
    int reload = ScheduleStep(layers, entry.reload_fwd, entry.reload_num);
    int own_forward = ScheduleStep(layers, true, layer + 1);
    int own_backward = ScheduleStep(layers, false, layers - layer);
    if (release <= own_forward) {
      return InvalidArgumentError(
          where + "its offload would have to finish before its own forward "
                  "ran (release at step " + std::to_string(release) +
          ", forward begins at step " + std::to_string(own_forward) + ")");
    }
    if (reload < release) {
      return InvalidArgumentError(
          where + "reload (step " + std::to_string(reload) +
          ") would start before the offload finished (step " +
          std::to_string(release) + ")");
    }
    if (reload > own_backward) {
      return InvalidArgumentError(
          where + "reload (step " + std::to_string(reload) +
          ") would start after its own backward began (step " +
          std::to_string(own_backward) + "): its tensors would be used "
          "before they are back");
    }
  }
  return OkStatus();
}

}  // namespace offload
