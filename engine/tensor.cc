#include "engine/tensor.h"

#include <limits>
#include <optional>
#include <string>

namespace offload {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// a * b, or the bound on the product's side of the range if it overflows.
int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) {
    return (a < 0) != (b < 0) ? kInt64Min : kInt64Max;
  }
  return product;
}

// a + b, or the bound on the sum's side of the range if it overflows (only
// possible when a and b have the same sign).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return b < 0 ? kInt64Min : kInt64Max;
  return sum;
}

// Whether `dtype` is one of the enum's values (not an integer cast to it).
bool IsKnownDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
      return true;
  }
  return false;
}

}  // namespace

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kU8:
      return 1;
    case DType::kI64:
      return 8;
  }
  return 1;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t size : shape) n = SaturatingMul(n, size);
  return n;
}

int64_t Tensor::nbytes() const {
  return SaturatingMul(numel(), element_size());
}

Status BufferMemory::ReleaseAfter(Stream& stream) {
  if (buffer_.empty()) {
    return FailedPreconditionError("ReleaseAfter: the buffer was released");
  }
  Backend* owner = buffer_.owner();
  return owner->Free(buffer_, stream);
}

Storage::Storage(Buffer buffer)
    : memory_(std::make_unique<BufferMemory>(std::move(buffer))) {}

const Buffer* Storage::buffer() const {
  const auto* memory = dynamic_cast<const BufferMemory*>(memory_.get());
  return memory != nullptr ? &memory->buffer() : nullptr;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride = SaturatingMul(stride, shape[i]);
  }
  return strides;
}

bool Tensor::IsContiguous() const {
  if (strides.size() != shape.size()) return false;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected = SaturatingMul(expected, shape[i]);
  }
  return true;
}

std::pair<int64_t, int64_t> Tensor::ByteExtent() const {
  const int64_t begin = SaturatingMul(offset, element_size());
  if (numel() == 0) return {begin, begin};
  if (strides.size() != shape.size()) return {begin, kInt64Max};
  int64_t last = offset;  // the element index of the last element
  for (size_t i = 0; i < shape.size(); ++i) {
    last = SaturatingAdd(
        last, SaturatingMul(SaturatingAdd(shape[i], -1), strides[i]));
  }
  return {begin, SaturatingMul(SaturatingAdd(last, 1), element_size())};
}

namespace {

std::string List(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace

std::string Tensor::Describe() const {
  return "'" + name + "' (" + std::string(DTypeName(dtype)) + " " +
         List(shape) + " strides " + List(strides) + " offset " +
         std::to_string(offset) + ")";
}

Status ValidateTensor(const Tensor& tensor) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("tensor " + tensor.Describe() + ": " + why);
  };
  if (tensor.storage == nullptr) return bad("has no storage");
  if (!IsKnownDType(tensor.dtype)) {
    return bad("has an unknown dtype " +
               std::to_string(static_cast<int>(tensor.dtype)));
  }
  if (tensor.shape.size() != tensor.strides.size()) {
    return bad("shape and strides differ in length");
  }
  if (tensor.offset < 0) return bad("negative offset");
  bool empty = false;
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    if (tensor.shape[i] < 0) return bad("negative size");
    if (tensor.strides[i] < 0) return bad("negative stride");
    if (tensor.shape[i] == 0) empty = true;
  }

  // The geometry, computed with overflow checks; from here on every value
  // is non-negative, so the saturating accessors give the same results.
  const int64_t element_size = tensor.element_size();
  const auto overflow = [&](const std::string& what) {
    return bad("size overflows: " + what + " does not fit in int64_t");
  };
  int64_t numel = 1;
  if (empty) {
    numel = 0;  // the other sizes may multiply past int64_t; the count is 0
  } else {
    for (int64_t size : tensor.shape) {
      if (__builtin_mul_overflow(numel, size, &numel)) {
        return overflow("the element count (the product of the sizes)");
      }
    }
  }
  int64_t nbytes;
  if (__builtin_mul_overflow(numel, element_size, &nbytes)) {
    return overflow("the byte size (" + std::to_string(numel) +
                    " elements of " + std::to_string(element_size) +
                    " bytes)");
  }
  int64_t begin;
  if (__builtin_mul_overflow(tensor.offset, element_size, &begin)) {
    return overflow("the byte offset");
  }
  int64_t end = begin;
  if (numel > 0) {
    int64_t last = tensor.offset;  // the element index of the last element
    for (size_t i = 0; i < tensor.shape.size(); ++i) {
      int64_t step;
      if (__builtin_mul_overflow(tensor.shape[i] - 1, tensor.strides[i],
                                 &step) ||
          __builtin_add_overflow(last, step, &last)) {
        return overflow("the index of the last element");
      }
    }
    if (__builtin_add_overflow(last, 1, &end) ||
        __builtin_mul_overflow(end, element_size, &end)) {
      return overflow("the byte extent");
    }
  }

  if (end > begin && tensor.storage->data() == nullptr) {
    return bad("its storage's memory is null (released, or never set)");
  }
  if (end > tensor.storage->size_bytes()) {
    return bad("reaches byte " + std::to_string(end) + " of a storage of " +
               std::to_string(tensor.storage->size_bytes()) + " bytes");
  }
  return OkStatus();
}

void MarkNotOffload(Tensor& tensor) { tensor.flags.do_not_offload = true; }

}  // namespace offload
