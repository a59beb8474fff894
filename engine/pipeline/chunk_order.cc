#include "engine/pipeline/chunk_order.h"

namespace offload {

void ChunkOrder::AddForward(int index, int stage) {
  const int last = static_cast<int>(per_stage_.size()) - 1;
  per_stage_[stage].push_back(index);
  if (last == 0 || stage != last) {
    if (last == 0) {
      backward_.push_back(index);
      ordered_[0] = per_stage_[0].size();
    }
    return;
  }
  backward_.push_back(index);
  ordered_[last] = per_stage_[last].size();
  if (per_stage_[last].size() != per_stage_[0].size()) return;
  for (int s = last - 1; s >= 0; --s) {
    for (size_t i = ordered_[s]; i < per_stage_[s].size(); ++i) {
      backward_.push_back(per_stage_[s][i]);
    }
    ordered_[s] = per_stage_[s].size();
  }
}

Status ChunkOrder::CheckComplete() const {
  for (size_t s = 1; s < per_stage_.size(); ++s) {
    if (per_stage_[s].size() != per_stage_[0].size()) {
      return FailedPreconditionError(
          "virtual stage " + std::to_string(s) + " ran " +
          std::to_string(per_stage_[s].size()) + " chunks and stage 0 ran " +
          std::to_string(per_stage_[0].size()) +
          "; every stage must run as many");
    }
  }
  return OkStatus();
}

}  // namespace offload
