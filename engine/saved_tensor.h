// SavedTensor: what a front door's Push returns and its Pop takes (the
// saved-tensor hooks' handle). A small value type: the tensor itself when
// it is not offloaded, a reference to an entry of an offload group, or a
// composite of such handles. Every handle names the front door that made
// it by an id unique for the life of the process, so a handle is never
// accepted by another front door, not even one built later at the same
// address.

#ifndef OFFLOAD_ENGINE_SAVED_TENSOR_H_
#define OFFLOAD_ENGINE_SAVED_TENSOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/tensor.h"

namespace offload {

// A fresh owner id for a front door: 1, 2, 3, ... (0 means "no owner").
// Thread-safe.
uint64_t NewSavedTensorOwnerId();

class SavedTensor {
 public:
  // Kept as is (not offloaded).
  struct Kept {
    Tensor tensor;
  };
  // Entry `index` of the group in slot `group` of its front door.
  struct InGroup {
    int group = -1;
    int index = -1;
  };
  // One handle per component (absent components stay absent).
  struct Composite {
    std::vector<std::optional<SavedTensor>> components;
    std::vector<uint8_t> metadata;
    std::string name;
  };

  // An empty handle (not from a Push).
  SavedTensor() = default;

  // Whether Push handed the tensor to a group (false: kept as is).
  bool in_group() const { return std::holds_alternative<InGroup>(value_); }
  // The layer (or group slot) it was pushed in; -1 before any layer.
  int layer() const { return pushed_layer_; }
  bool is_composite() const {
    return std::holds_alternative<Composite>(value_);
  }

  // For the front doors.
  uint64_t owner() const { return owner_; }
  uint64_t iteration() const { return iteration_; }
  const Kept* kept() const { return std::get_if<Kept>(&value_); }
  const InGroup* group_entry() const { return std::get_if<InGroup>(&value_); }
  const Composite* composite() const {
    return std::get_if<Composite>(&value_);
  }

 private:
  // Handles are made by a front door's HandleMaker (engine/core/
  // handle_maker.h) only, so a caller cannot forge one; tests that must
  // (hostile handles) use SavedTensorForge (testing/saved_tensor_forge.h).
  friend class HandleMaker;
  friend class SavedTensorForge;
  SavedTensor(uint64_t owner, uint64_t iteration, int pushed_layer,
              std::variant<std::monostate, Kept, InGroup, Composite> value)
      : owner_(owner),
        iteration_(iteration),
        pushed_layer_(pushed_layer),
        value_(std::move(value)) {}

  uint64_t owner_ = 0;
  uint64_t iteration_ = 0;
  int pushed_layer_ = -1;
  std::variant<std::monostate, Kept, InGroup, Composite> value_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_SAVED_TENSOR_H_
