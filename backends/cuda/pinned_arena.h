// PinnedArena: the bookkeeping of CudaBackend's pinned host memory pool.
//
// The backend gets pinned memory from the driver in large slabs
// (cudaHostAlloc) and hands out pieces of them; this class only does the
// address arithmetic, so it has no CUDA dependency. Each slab is tiled by
// chunks; a chunk is free or handed out. Allocate takes the smallest free
// chunk that fits (lowest address among equals) and splits off the rest;
// Free merges a chunk with free neighbours of the same slab. Slabs are never
// merged with each other, even when adjacent in the address space.
//
// Sizes are rounded up to `alignment`, so every handed-out address is
// aligned to it if slab bases are. Not thread-safe (the backend locks).

#ifndef OFFLOAD_BACKENDS_CUDA_PINNED_ARENA_H_
#define OFFLOAD_BACKENDS_CUDA_PINNED_ARENA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace offload {

class PinnedArena {
 public:
  // REQUIRES: alignment is a power of two.
  explicit PinnedArena(int64_t alignment = 256);

  // Adds [base, base + size) as a new slab, all free.
  // REQUIRES: size > 0 and a multiple of alignment; no overlap with a slab.
  void AddSlab(uintptr_t base, int64_t size);

  // Hands out a chunk of at least `bytes` (> 0) bytes; nullopt if no free
  // chunk is large enough.
  std::optional<uintptr_t> Allocate(int64_t bytes);

  // Returns the chunk that Allocate handed out at `address`. Returns false
  // (and changes nothing) if no chunk was handed out there.
  bool Free(uintptr_t address);

  // Whether [address, address + bytes) lies inside the requested bytes of
  // one handed-out chunk.
  bool Contains(uintptr_t address, int64_t bytes) const;

  // Removes the slabs in which nothing is handed out and returns them as
  // (base, size).
  std::vector<std::pair<uintptr_t, int64_t>> RemoveEmptySlabs();

  int64_t alignment() const { return alignment_; }
  int64_t slab_count() const { return static_cast<int64_t>(slabs_.size()); }
  int64_t slab_bytes() const { return slab_bytes_; }
  // Bytes handed out, rounded up to the alignment.
  int64_t used_bytes() const { return used_bytes_; }
  int64_t free_bytes() const { return slab_bytes_ - used_bytes_; }
  // The largest free chunk (0 if none).
  int64_t largest_free_chunk() const;
  int64_t allocated_chunks() const { return allocated_chunks_; }

 private:
  struct Chunk {
    int64_t size = 0;       // bytes of the chunk (a multiple of alignment)
    int64_t requested = 0;  // bytes asked for; 0 when free
    uintptr_t slab = 0;     // base of the slab it belongs to
    bool free = true;
  };

  int64_t RoundUp(int64_t bytes) const {
    return (bytes + alignment_ - 1) & ~(alignment_ - 1);
  }

  const int64_t alignment_;
  std::map<uintptr_t, Chunk> chunks_;                 // by address
  std::set<std::pair<int64_t, uintptr_t>> free_;      // (size, address)
  std::map<uintptr_t, int64_t> slabs_;                // base -> size
  int64_t slab_bytes_ = 0;
  int64_t used_bytes_ = 0;
  int64_t allocated_chunks_ = 0;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_CUDA_PINNED_ARENA_H_
