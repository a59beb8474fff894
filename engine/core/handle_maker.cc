#include "engine/core/handle_maker.h"

#include <utility>

namespace offload {

HandleMaker::HandleMaker(std::string front_door)
    : front_door_(std::move(front_door)) {}

std::string HandleMaker::Iteration() const {
  return "iteration " + std::to_string(iteration_);
}

SavedTensor HandleMaker::Kept(const Tensor& tensor, int slot) const {
  return SavedTensor(owner_, iteration_, slot, SavedTensor::Kept{tensor});
}

SavedTensor HandleMaker::InGroup(int slot, int group, int index) const {
  return SavedTensor(owner_, iteration_, slot,
                     SavedTensor::InGroup{group, index});
}

SavedTensor HandleMaker::Composite(int slot,
                                   SavedTensor::Composite composite) const {
  return SavedTensor(owner_, iteration_, slot, std::move(composite));
}

Status HandleMaker::Check(const SavedTensor& saved, bool check_iteration,
                          const std::string& call) const {
  if (saved.owner() == 0) {
    return InvalidArgumentError(call +
                                ": an empty SavedTensor (not from Push)");
  }
  if (saved.owner() != owner_) {
    return InvalidArgumentError(call + ": the SavedTensor belongs to another " +
                                front_door_);
  }
  if (check_iteration && saved.iteration() != iteration_) {
    return InvalidArgumentError(
        call + ": the SavedTensor was pushed in iteration " +
        std::to_string(saved.iteration()) + ", this is iteration " +
        std::to_string(iteration_));
  }
  return OkStatus();
}

}  // namespace offload
