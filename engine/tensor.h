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

// Bytes per element: 4, 2, 2, 1, 1, 1, 4, 8.
int64_t DTypeSize(DType dtype);
// "f32", "bf16", ...
std::string_view DTypeName(DType dtype);

// One allocation shared by the tensors that view it.
class Storage {
 public:
  explicit Storage(Buffer buffer) : buffer_(std::move(buffer)) {}

  void* data() const { return buffer_.data(); }
  int64_t size_bytes() const { return buffer_.size(); }
  MemorySpace space() const { return buffer_.space(); }
  const Buffer& buffer() const { return buffer_; }
  // For the engine, to free the memory explicitly (Backend::Free) once it
  // holds the last reference.
  Buffer& mutable_buffer() { return buffer_; }

 private:
  Buffer buffer_;
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

  int64_t numel() const;
  int64_t element_size() const { return DTypeSize(dtype); }
  int64_t nbytes() const { return numel() * element_size(); }
  // Row-major contiguous: strides are those of a dense array of `shape`.
  bool IsContiguous() const;
  // The bytes of the storage the view can touch: [begin, end), relative to
  // the storage's start. Empty (begin == end) for a tensor of no elements.
  std::pair<int64_t, int64_t> ByteExtent() const;
  // "'name' (bf16 [4, 8] strides [8, 1] offset 0)".
  std::string Describe() const;
};

// Row-major strides for `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

// OK if `tensor` is a well-formed view: a storage is set, shape and strides
// have the same length, sizes are non-negative, strides non-negative, and
// every element lies inside the storage. Errors: kInvalidArgument naming the
// tensor and the problem.
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
