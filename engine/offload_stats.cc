#include "engine/offload_stats.h"

namespace offload {

const char* GroupStateName(GroupState state) {
  switch (state) {
    case GroupState::kNotOffloaded:
      return "not_offloaded";
    case GroupState::kOffloadStarted:
      return "offload_started";
    case GroupState::kOffloadFinished:
      return "offload_finished";
    case GroupState::kReloadStarted:
      return "reload_started";
    case GroupState::kReleased:
      return "released";
    case GroupState::kKeptOnDevice:
      return "kept_on_device";
  }
  return "unknown";
}

}  // namespace offload
