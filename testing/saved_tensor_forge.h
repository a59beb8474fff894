// SavedTensorForge: makes SavedTensors with any fields, for tests that hand
// a front door a forged or corrupted handle (Pop must refuse it with an
// error, never read out of bounds). Outside tests handles come only from a
// front door's Push (SavedTensor's constructor is private to the engine).

#ifndef OFFLOAD_TESTING_SAVED_TENSOR_FORGE_H_
#define OFFLOAD_TESTING_SAVED_TENSOR_FORGE_H_

#include <cstdint>
#include <utility>

#include "engine/saved_tensor.h"

namespace offload {

class SavedTensorForge {
 public:
  // A handle claiming entry `entry` of a group, as if pushed by the front
  // door `owner` (SavedTensor::owner() of a real handle) in `iteration`
  // and layer or slot `pushed`.
  static SavedTensor InGroup(uint64_t owner, uint64_t iteration, int pushed,
                             SavedTensor::InGroup entry) {
    return SavedTensor(owner, iteration, pushed, entry);
  }
  // The same handle as `real` with another group entry.
  static SavedTensor Like(const SavedTensor& real,
                          SavedTensor::InGroup entry) {
    return InGroup(real.owner(), real.iteration(), real.layer(), entry);
  }
};

}  // namespace offload

#endif  // OFFLOAD_TESTING_SAVED_TENSOR_FORGE_H_
