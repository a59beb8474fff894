// Tensors for tests and the workload driver: device tensors filled with
// deterministic bytes, reading a tensor's logical bytes back, and views
// (slices, transposes, reshapes) that share a storage without copying, as
// PyTorch's view operations do.
//
//   ASSERT_OK_AND_ASSIGN(Tensor qkv, MakeDeviceTensor(backend, DType::kBF16,
//                                                     {128, 4, 3 * 256}, 7));
//   ASSERT_OK_AND_ASSIGN(Tensor k, Slice(qkv, 2, 256, 512));
//   ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, ReadTensorBytes(backend, k));
//   EXPECT_EQ(got, PatternTensorBytes(k, 7));
//
// Byte `i` of a storage made by MakeDeviceTensor(..., seed) is
// PatternByte(i, seed) (workload/pattern_bytes.h), so the expected bytes of any
// view of it can be computed on the host without touching the device
// (PatternTensorBytes).

#ifndef OFFLOAD_WORKLOAD_TENSOR_UTIL_H_
#define OFFLOAD_WORKLOAD_TENSOR_UTIL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// Allocates a contiguous tensor of `shape` on backend.ComputeStream() and
// fills storage byte i with PatternByte(i, seed): the bytes are staged in
// pinned memory and copied on the compute stream, so they are ready for any
// later work on the compute stream (no ready event is set). The staging
// buffer is freed ordered on the compute stream, after the copy. A tensor of
// no elements gets a storage of one element and no copy. The tensor is named
// "pattern<seed>".
// Errors: kInvalidArgument for a negative size or a byte size that overflows;
//   whatever AllocateDevice, AllocatePinned or Copy return
//   (kResourceExhausted when memory runs out).
StatusOr<Tensor> MakeDeviceTensor(Backend& backend, DType dtype,
                                  std::vector<int64_t> shape, uint64_t seed);

// The logical bytes of `tensor`: its elements in row-major order of its
// shape, each read at offset + sum(index * stride), for any strided view.
// Copies the view's byte extent to pinned memory on the compute stream
// (after waiting for `tensor.ready` there, if set), synchronizes the compute
// stream and gathers on the host. A tensor in pinned memory is read directly
// after synchronizing the compute stream. Empty for a tensor of no elements.
// Errors: kInvalidArgument for a malformed tensor (ValidateTensor); what the
//   backend returns for the copy or the synchronization.
StatusOr<std::vector<uint8_t>> ReadTensorBytes(Backend& backend,
                                               const Tensor& tensor);

// Host-side gather: the logical bytes of `view` (as ReadTensorBytes returns
// them) given `bytes`, which holds the bytes of the view's storage starting
// at storage byte `first_byte`. Only view's geometry (dtype, shape, strides,
// offset) is used; its storage may be null.
// Errors: kInvalidArgument if shape and strides differ in length, a size,
//   stride or the offset is negative, or an element lies outside `bytes`.
StatusOr<std::vector<uint8_t>> GatherViewBytes(std::span<const uint8_t> bytes,
                                               int64_t first_byte,
                                               const Tensor& view);

// The logical bytes `view` has when its storage was filled by
// MakeDeviceTensor(..., seed): computed on the host from the pattern, no
// device access. REQUIRES: a well-formed geometry (see GatherViewBytes);
// returns an empty vector otherwise.
std::vector<uint8_t> PatternTensorBytes(const Tensor& view, uint64_t seed);

// Views. Each returns a new Tensor sharing `tensor`'s storage, flags, ready
// event and dtype; nothing is copied and nothing is enqueued. The name gets a
// suffix describing the view ("x.slice(1,0:8:2)"). Errors: kInvalidArgument
// for a malformed input tensor or arguments out of range, naming both.

// x[start:stop:step] along `dim`: 0 <= start <= stop <= size, step >= 1.
StatusOr<Tensor> Slice(const Tensor& tensor, int dim, int64_t start,
                       int64_t stop, int64_t step = 1);

// x.select(dim, index): drops `dim`, 0 <= index < size.
StatusOr<Tensor> Select(const Tensor& tensor, int dim, int64_t index);

// x.transpose(d0, d1): swaps two dimensions' sizes and strides.
StatusOr<Tensor> Transpose(const Tensor& tensor, int d0, int d1);

// x.permute(dims): dimension i of the result is dimension dims[i] of x.
// `dims` must be a permutation of 0..rank-1.
StatusOr<Tensor> Permute(const Tensor& tensor, const std::vector<int>& dims);

// x.view(shape) for a contiguous x: same offset, contiguous strides for
// `shape`, whose element count must equal x's. Errors also when x is not
// contiguous (a reshape would have to copy).
StatusOr<Tensor> Reshape(const Tensor& tensor, std::vector<int64_t> shape);

// The views of an attention output whose base is strided, as in PyTorch's
// scaled_dot_product_attention followed by `o.transpose(1, 2).reshape(...)`:
// the storage is laid out as a contiguous [B, S, H, D] array; `base` is the
// [B, H, S, D] view of it (not contiguous: the kernel's output tensor); `view`
// is the contiguous [B, S, H*D] view taken from `base` (what the next layer
// saves). TE's offloader replaced such a view by its base and then rejected
// it (SPEC §2.1). `storage_view` is the contiguous [B, S, H, D] view of the
// whole storage.
struct StridedBaseViews {
  Tensor storage_view;
  Tensor base;
  Tensor view;
};

// Allocates and fills the storage with MakeDeviceTensor(seed) and builds the
// views above. Errors: as MakeDeviceTensor; kInvalidArgument for a size < 1.
StatusOr<StridedBaseViews> MakeAttentionOutput(Backend& backend, DType dtype,
                                               int64_t batch, int64_t seq,
                                               int64_t heads, int64_t head_dim,
                                               uint64_t seed);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_TENSOR_UTIL_H_
