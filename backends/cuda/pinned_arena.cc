#include "backends/cuda/pinned_arena.h"

#include <cassert>
#include <iterator>

namespace offload {

PinnedArena::PinnedArena(int64_t alignment) : alignment_(alignment) {
  assert(alignment > 0 && (alignment & (alignment - 1)) == 0);
}

void PinnedArena::AddSlab(uintptr_t base, int64_t size) {
  assert(size > 0 && size % alignment_ == 0);
  slabs_.emplace(base, size);
  slab_bytes_ += size;
  chunks_.emplace(base, Chunk{size, 0, base, true});
  free_.emplace(size, base);
}

std::optional<uintptr_t> PinnedArena::Allocate(int64_t bytes) {
  if (bytes <= 0 || bytes > slab_bytes_) return std::nullopt;
  const int64_t need = RoundUp(bytes);
  auto best = free_.lower_bound({need, 0});
  if (best == free_.end()) return std::nullopt;
  const uintptr_t address = best->second;
  free_.erase(best);
  Chunk& chunk = chunks_.at(address);
  if (chunk.size > need) {
    // Split: the tail stays free.
    const uintptr_t tail = address + static_cast<uintptr_t>(need);
    const int64_t tail_size = chunk.size - need;
    chunks_.emplace(tail, Chunk{tail_size, 0, chunk.slab, true});
    free_.emplace(tail_size, tail);
    chunk.size = need;
  }
  chunk.free = false;
  chunk.requested = bytes;
  used_bytes_ += chunk.size;
  ++allocated_chunks_;
  return address;
}

bool PinnedArena::Free(uintptr_t address) {
  auto it = chunks_.find(address);
  if (it == chunks_.end() || it->second.free) return false;
  Chunk& chunk = it->second;
  used_bytes_ -= chunk.size;
  --allocated_chunks_;
  chunk.free = true;
  chunk.requested = 0;
  // Merge with the next chunk of the same slab.
  auto next = std::next(it);
  if (next != chunks_.end() && next->second.free &&
      next->second.slab == chunk.slab) {
    free_.erase({next->second.size, next->first});
    chunk.size += next->second.size;
    chunks_.erase(next);
  }
  // Merge with the previous chunk of the same slab.
  if (it != chunks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.slab == chunk.slab) {
      free_.erase({prev->second.size, prev->first});
      prev->second.size += chunk.size;
      chunks_.erase(it);
      free_.emplace(prev->second.size, prev->first);
      return true;
    }
  }
  free_.emplace(chunk.size, it->first);
  return true;
}

bool PinnedArena::Contains(uintptr_t address, int64_t bytes) const {
  if (bytes < 0) return false;
  auto it = chunks_.upper_bound(address);
  if (it == chunks_.begin()) return false;
  --it;
  const Chunk& chunk = it->second;
  if (chunk.free) return false;
  const uintptr_t offset = address - it->first;
  return offset <= static_cast<uintptr_t>(chunk.requested) &&
         static_cast<uintptr_t>(bytes) <=
             static_cast<uintptr_t>(chunk.requested) - offset;
}

std::vector<std::pair<uintptr_t, int64_t>> PinnedArena::RemoveEmptySlabs() {
  std::vector<std::pair<uintptr_t, int64_t>> removed;
  for (auto slab = slabs_.begin(); slab != slabs_.end();) {
    auto chunk = chunks_.find(slab->first);
    if (chunk != chunks_.end() && chunk->second.free &&
        chunk->second.size == slab->second) {
      free_.erase({chunk->second.size, chunk->first});
      chunks_.erase(chunk);
      slab_bytes_ -= slab->second;
      removed.push_back(*slab);
      slab = slabs_.erase(slab);
    } else {
      ++slab;
    }
  }
  return removed;
}

int64_t PinnedArena::largest_free_chunk() const {
  return free_.empty() ? 0 : free_.rbegin()->first;
}

}  // namespace offload
