#include "engine/policy/offloader_policy.h"

namespace offload {

const char* ManualCallName(ManualCall call) {
  switch (call) {
    case ManualCall::kStartOffload:
      return "StartOffload";
    case ManualCall::kReleaseForwardMemory:
      return "ReleaseForwardMemory";
    case ManualCall::kStartReload:
      return "StartReload";
  }
  return "unknown manual call";
}

}  // namespace offload
