// The tensor model: storages shared by views, flags, ready events, and
// composite (quantized) tensors.
//
// A Storage owns one allocation (a Buffer). A Tensor is a view onto a
// storage: dtype, shape, strides and offset, all in elements of its dtype,
// like a PyTorch tensor. Copies of a Tensor share the storage; the storage's
// memory is returned when the last view (and the engine's references) go.

#ifndef OFFLOAD_ENGINE_TENSOR_H_
#define OFFLOAD_ENGINE_TENSOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

enum class DType { kF32, kBF16, kF16, kFP8E4M3, kFP8E5M2, kU8, kI32, kI64 };

// Bytes per element: 4, 2, 2, 1, 1, 1, 4, 8. For a value outside the enum
// (an integer cast to DType) returns 1, so that geometry stays defined;
// ValidateTensor rejects tensors with such a dtype.
int64_t DTypeSize(DType dtype);
// "f32", "bf16", ...; "unknown" for a value outside the enum.
std::string_view DTypeName(DType dtype);

// Who owns a storage's memory, and how it goes back (the engine does not
// care who allocated it). Backend-made Buffers are one implementation
// (BufferMemory, below); a framework's allocator (PyTorch's caching
// allocator, through a binding) can be another, without touching the engine.
class StorageMemory {
 public:
  virtual ~StorageMemory() = default;

  // Start address (device or pinned), size and space of the memory; null
  // data and size 0 once released.
  virtual void* data() const = 0;
  virtual int64_t size_bytes() const = 0;
  virtual MemorySpace space() const = 0;
  // The backend whose streams may read and write the memory; nullptr when
  // unknown (then no backend's copies may touch it).
  virtual const Backend* backend() const = 0;

  // Whether someone outside the Storage object that holds this memory still
  // keeps it alive (e.g. a framework tensor). Backend buffers: never.
  virtual bool HeldOutside() const { return false; }

  // Gives the memory back, ordered after everything enqueued on `stream` so
  // far (like PyTorch's record_stream followed by dropping the last
  // reference): work ordered after that point may reuse it. On success
  // data() is null. Work on other streams that still uses the memory must
  // have been ordered before this call by the caller.
  // REQUIRES: `stream` belongs to backend().
  // Errors: kFailedPrecondition if already released; what the owner's free
  //   returns (then nothing changed).
  virtual Status ReleaseAfter(Stream& stream) = 0;
};

// StorageMemory for a Buffer a Backend made: ReleaseAfter is Backend::Free.
class BufferMemory final : public StorageMemory {
 public:
  explicit BufferMemory(Buffer buffer) : buffer_(std::move(buffer)) {}
  void* data() const override { return buffer_.data(); }
  int64_t size_bytes() const override { return buffer_.size(); }
  MemorySpace space() const override { return buffer_.space(); }
  const Backend* backend() const override { return buffer_.owner(); }
  Status ReleaseAfter(Stream& stream) override;
  const Buffer& buffer() const { return buffer_; }

 private:
  Buffer buffer_;
};

// One allocation shared by the tensors that view it (through
// std::shared_ptr<Storage>). The engine holds some of those references
// while a group owns the tensors; it gives the memory back (ReleaseAfter)
// only when nobody else holds the storage: not another shared_ptr, and not
// the memory's owner (HeldOutside).
class Storage {
 public:
  // A storage over a Backend-made buffer (BufferMemory).
  explicit Storage(Buffer buffer);
  // A storage over memory owned elsewhere. REQUIRES: `memory` non-null.
  explicit Storage(std::unique_ptr<StorageMemory> memory)
      : memory_(std::move(memory)) {}

  void* data() const { return memory_->data(); }
  int64_t size_bytes() const { return memory_->size_bytes(); }
  MemorySpace space() const { return memory_->space(); }
  const Backend* backend() const { return memory_->backend(); }
  StorageMemory& memory() const { return *memory_; }
  // The Backend buffer, for BufferMemory storages; nullptr otherwise.
  const Buffer* buffer() const;

 private:
  std::unique_ptr<StorageMemory> memory_;
};

struct TensorFlags {
  bool parameter = false;       // torch.nn.Parameter: never offloaded
  bool weight = false;          // a weight that is not a Parameter (TE is_weight)
  bool do_not_offload = false;  // mark_not_offload
  // Offload the whole storage (the view's base) even when the views pushed
  // cover little of it, rather than making a sparse view contiguous.
  bool offload_base = false;
};

// A view onto a storage. A value type: copies share the storage and the
// ready event.
struct Tensor {
  std::shared_ptr<Storage> storage;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; same length as shape
  int64_t offset = 0;            // elements from the storage's start
  TensorFlags flags;
  // Optional (TE's start_offload): the point on the producing stream after
  // which the tensor's bytes are final. Without it, Push records one on the
  // compute stream.
  std::shared_ptr<Event> ready;
  std::string name;  // for messages; may be empty

  // Geometry. For a tensor that ValidateTensor accepts these are exact. For
  // any other tensor they are still defined (no overflow, no read past the
  // end of `strides`), but a value that does not fit in int64_t saturates:
  // it becomes INT64_MAX (INT64_MIN if negative, which only malformed
  // negative sizes or offsets give). A saturated size or extent is larger
  // than any storage, so a bounds check against one fails. Callers that
  // need exact values validate first: ValidateTensor rejects every tensor
  // whose geometry overflows ("size overflows").

  // The product of the sizes (1 for a scalar), multiplied out from the first
  // size with saturation; 0 whenever a size is 0, however large the others.
  int64_t numel() const;
  int64_t element_size() const { return DTypeSize(dtype); }
  // numel() * element_size(), saturated.
  int64_t nbytes() const;
  // Row-major contiguous: strides are those of a dense array of `shape`
  // (ContiguousStrides, saturation included). False if shape and strides
  // differ in length.
  bool IsContiguous() const;
  // The bytes of the storage the view can touch: [begin, end), relative to
  // the storage's start. Empty (begin == end) for a tensor of no elements.
  // Saturated as above: for [2^62 + 1] with stride 4 of f32 it is
  // {0, INT64_MAX}, not a wrapped-around small range. If shape and strides
  // differ in length (and numel() != 0), end is INT64_MAX.
  std::pair<int64_t, int64_t> ByteExtent() const;
  // "'name' (bf16 [4, 8] strides [8, 1] offset 0)".
  std::string Describe() const;
};

// Row-major strides for `shape`: each is the product of the sizes after it.
// A stride that does not fit in int64_t saturates at INT64_MAX (possible
// only where a later size is so large that numel() overflows, or where an
// earlier size is 0 and the tensor is empty).
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

// OK if `tensor` is a well-formed view: a storage is set, the dtype is one
// of the enum's values, shape and strides have the same length, sizes,
// strides and offset are non-negative, the element count, the byte size and
// the byte extent all fit in int64_t, the storage's memory is not null (or
// released) unless the view has no elements, and every element lies inside
// the storage. On OK, numel(), nbytes() and ByteExtent() are exact.
// Errors: kInvalidArgument whose message names the tensor (Describe) and
//   the problem; "size overflows" when a size does not fit in int64_t.
Status ValidateTensor(const Tensor& tensor);

// Sets the do-not-offload flag (TE's mark_not_offload).
void MarkNotOffload(Tensor& tensor);

// A quantized tensor (FP8, MXFP8, NVFP4 style): optional components such as
// data, transposed data and scales, plus opaque metadata (scaling recipe,
// original dtype, ...). The engine treats each component as a tensor of its
// own and gives back an equal composite.
struct CompositeTensor {
  std::vector<std::optional<Tensor>> components;
  std::vector<uint8_t> metadata;
  std::string name;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_TENSOR_H_
