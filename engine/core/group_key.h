// GroupKey: which offload group a saved tensor belongs to. The mechanism
// (engine/core) moves groups; the front doors decide what a group is: a
// whole layer (TE's layer mode) or a named submodule of a layer inside a
// pipeline chunk (Megatron's fine-grained mode, SPEC §5).

#ifndef OFFLOAD_ENGINE_CORE_GROUP_KEY_H_
#define OFFLOAD_ENGINE_CORE_GROUP_KEY_H_

#include <string>

namespace offload {

struct GroupKey {
  // Layer mode: the layer id; -1 in the fine-grained mode.
  int layer = -1;
  // Layer mode with a byte budget (SPEC §4.7): the unit (one storage's
  // views) among the iteration's units; -1 otherwise.
  int unit = -1;
  // Fine-grained mode: the chunk (virtual pipeline stage, microbatch), the
  // group's name and its ordinal among the groups of that name in the
  // chunk (one per layer of the chunk).
  int stage = -1;
  int microbatch = -1;
  std::string name;
  int ordinal = 0;

  static GroupKey Layer(int layer) {
    GroupKey key;
    key.layer = layer;
    return key;
  }
  static GroupKey Unit(int layer, int unit) {
    GroupKey key;
    key.layer = layer;
    key.unit = unit;
    return key;
  }
  static GroupKey Named(int stage, int microbatch, std::string name,
                        int ordinal) {
    GroupKey key;
    key.stage = stage;
    key.microbatch = microbatch;
    key.name = std::move(name);
    key.ordinal = ordinal;
    return key;
  }

  bool is_layer() const { return layer >= 0; }

  // "layer 3", "layer 3 unit 12", or
  // "group 'qkv_linear' #2 of chunk (stage 0, microbatch 1)".
  std::string ToString() const {
    if (is_layer()) {
      return "layer " + std::to_string(layer) +
             (unit >= 0 ? " unit " + std::to_string(unit) : "");
    }
    return "group '" + name + "' #" + std::to_string(ordinal) +
           " of chunk (stage " + std::to_string(stage) + ", microbatch " +
           std::to_string(microbatch) + ")";
  }

  friend bool operator==(const GroupKey&, const GroupKey&) = default;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_GROUP_KEY_H_
