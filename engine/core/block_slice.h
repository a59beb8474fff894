// BlockSlice: a Storage's memory that is a sub-range of a device block
// shared with other slices (one allocation for all the spans of a group's
// reload: one AllocateDevice and one Free per group instead of one per span).
//
// The block is freed when its last slice goes: by ReleaseAfter, or by the
// last holder dropping it (then, like a dropped Buffer, on the block's
// allocation stream as of that point). The block is freed on its allocation
// stream (the "home" stream, the compute stream for reloads). A slice
// released on another stream first makes the home stream wait for that
// stream's current point, so that the block's free, whichever slice goes
// last, is ordered after the users of every slice.

#ifndef OFFLOAD_ENGINE_CORE_BLOCK_SLICE_H_
#define OFFLOAD_ENGINE_CORE_BLOCK_SLICE_H_

#include <cstdint>
#include <memory>

#include "engine/backend.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class BlockSlice final : public StorageMemory {
 public:
  // `size` bytes from byte `offset` of `block`, a device buffer.
  // REQUIRES: block non-null and non-empty; the range lies inside it.
  BlockSlice(std::shared_ptr<Buffer> block, int64_t offset, int64_t size)
      : block_(std::move(block)), offset_(offset), size_(size) {}

  void* data() const override;
  int64_t size_bytes() const override { return block_ ? size_ : 0; }
  MemorySpace space() const override { return MemorySpace::kDevice; }
  const Backend* backend() const override;

  // Gives the slice back, ordered after the work enqueued on `stream` so far
  // (see above); frees the block if it is the last slice.
  // Errors: kFailedPrecondition if released already; what NewEvent, Record,
  //   Wait or Free return (then the slice is still held).
  Status ReleaseAfter(Stream& stream) override;

 private:
  std::shared_ptr<Buffer> block_;  // null once released
  const int64_t offset_;
  const int64_t size_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_BLOCK_SLICE_H_
