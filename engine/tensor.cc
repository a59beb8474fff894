#include "engine/tensor.h"

#include <string>

namespace offload {

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
  for (int64_t size : shape) n *= size;
  return n;
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
    stride *= shape[i];
  }
  return strides;
}

bool Tensor::IsContiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::pair<int64_t, int64_t> Tensor::ByteExtent() const {
  if (numel() == 0) return {offset * element_size(), offset * element_size()};
  int64_t last = offset;
  for (size_t i = 0; i < shape.size(); ++i) last += (shape[i] - 1) * strides[i];
  return {offset * element_size(), (last + 1) * element_size()};
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
  if (tensor.shape.size() != tensor.strides.size()) {
    return bad("shape and strides differ in length");
  }
  if (tensor.offset < 0) return bad("negative offset");
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    if (tensor.shape[i] < 0) return bad("negative size");
    if (tensor.strides[i] < 0) return bad("negative stride");
  }
  auto [begin, end] = tensor.ByteExtent();
  if (end > tensor.storage->size_bytes()) {
    return bad("reaches byte " + std::to_string(end) + " of a storage of " +
               std::to_string(tensor.storage->size_bytes()) + " bytes");
  }
  return OkStatus();
}

void MarkNotOffload(Tensor& tensor) { tensor.flags.do_not_offload = true; }

}  // namespace offload
