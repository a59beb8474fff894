// HandleMaker: the SavedTensors one front door hands out.
//
// Every handle names the front door that made it (an owner id unique for
// the life of the process) and the iteration it was pushed in, so that Pop
// refuses another front door's handles and stale ones. Each front door
// owns one HandleMaker; it is the engine's only way to make a handle
// (SavedTensor's constructor is private to it).

#ifndef OFFLOAD_ENGINE_CORE_HANDLE_MAKER_H_
#define OFFLOAD_ENGINE_CORE_HANDLE_MAKER_H_

#include <cstdint>
#include <string>

#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class HandleMaker {
 public:
  // `front_door` names the front door in messages ("Offloader").
  explicit HandleMaker(std::string front_door);

  // The iteration handles are made in now: 1, 2, ...
  uint64_t iteration() const { return iteration_; }
  // "iteration 3", for messages.
  std::string Iteration() const;
  // The iteration ended: handles made so far are stale.
  void NextIteration() { ++iteration_; }

  // `tensor` kept as is, pushed in `slot` (a layer or group slot; -1 when
  // no layer or group was open).
  SavedTensor Kept(const Tensor& tensor, int slot) const;
  // Entry `index` of the group in slot `group`, pushed in `slot`.
  SavedTensor InGroup(int slot, int group, int index) const;
  // A composite of handles, pushed in `slot`.
  SavedTensor Composite(int slot, SavedTensor::Composite composite) const;

  // OK if `saved` came from this front door (in this iteration, unless
  // `check_iteration` is false). Errors: kInvalidArgument prefixed by
  // `call`: an empty handle, another front door's, or another iteration's.
  Status Check(const SavedTensor& saved, bool check_iteration,
               const std::string& call) const;

 private:
  const std::string front_door_;
  const uint64_t owner_ = NewSavedTensorOwnerId();
  uint64_t iteration_ = 1;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_HANDLE_MAKER_H_
