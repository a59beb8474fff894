// What offload_group.cc and offload_group_reload.cc share: the packing of
// spans into pinned or device blocks. Private to //engine/core:offload_group.

#ifndef OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_INTERNAL_H_
#define OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace offload::offload_group_internal {

// "<n> B", for sizes in messages.
std::string Bytes(int64_t n);

// Where spans of `sizes` go: the blocks' sizes and tags, and each span's
// block and offset.
struct BlockLayout {
  std::vector<int64_t> block_sizes;
  std::vector<int64_t> block_tags;
  std::vector<int> block;
  std::vector<int64_t> offset;
};

// Packs spans of `sizes` (span i tagged tags[i]) into blocks, each block
// holding spans of one tag (offload_group.cc says how).
BlockLayout PackByTag(const std::vector<int64_t>& sizes,
                      const std::vector<int64_t>& tags);

}  // namespace offload::offload_group_internal

#endif  // OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_INTERNAL_H_
