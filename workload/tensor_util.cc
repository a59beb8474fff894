#include "workload/tensor_util.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "workload/pattern_bytes.h"

namespace offload {
namespace {

std::string ListText(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

// Checks the geometry GatherViewBytes relies on; the storage is not looked at.
Status CheckGeometry(const Tensor& view) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("tensor " + view.Describe() + ": " + why);
  };
  if (view.shape.size() != view.strides.size()) {
    return bad("shape and strides differ in length");
  }
  if (view.offset < 0) return bad("negative offset");
  for (size_t i = 0; i < view.shape.size(); ++i) {
    if (view.shape[i] < 0) return bad("negative size");
    if (view.strides[i] < 0) return bad("negative stride");
  }
  return OkStatus();
}

// Normalizes a dimension index, or fails naming the tensor and the call.
StatusOr<size_t> Dim(const Tensor& tensor, int dim, const char* call) {
  if (dim < 0 || static_cast<size_t>(dim) >= tensor.shape.size()) {
    return InvalidArgumentError(std::string(call) + ": dimension " +
                                std::to_string(dim) + " out of range for " +
                                tensor.Describe());
  }
  return static_cast<size_t>(dim);
}

}  // namespace

StatusOr<Tensor> MakeDeviceTensor(Backend& backend, DType dtype,
                                  std::vector<int64_t> shape, uint64_t seed) {
  const std::string name = "pattern" + std::to_string(seed);
  int64_t bytes = DTypeSize(dtype);
  for (int64_t size : shape) {
    if (size < 0) {
      return InvalidArgumentError("MakeDeviceTensor " + name +
                                  ": negative size in shape " +
                                  ListText(shape));
    }
    if (__builtin_mul_overflow(bytes, size, &bytes)) {
      return InvalidArgumentError("MakeDeviceTensor " + name + ": shape " +
                                  ListText(shape) + " overflows int64 bytes");
    }
  }
  Stream& compute = backend.ComputeStream();
  const int64_t storage_bytes = bytes > 0 ? bytes : DTypeSize(dtype);
  OFFLOAD_ASSIGN_OR_RETURN(Buffer device,
                           backend.AllocateDevice(storage_bytes, compute));
  if (bytes > 0) {
    OFFLOAD_ASSIGN_OR_RETURN(Buffer staging, backend.AllocatePinned(bytes));
    FillPattern(staging.data(), bytes, seed);
    // On failure nothing was enqueued: dropping `staging` is then safe.
    OFFLOAD_RETURN_IF_ERROR(compute.Copy(device.data(), staging.data(), bytes));
    // Ordered after the copy on the same stream.
    OFFLOAD_RETURN_IF_ERROR(backend.Free(staging, compute));
  }
  Tensor tensor;
  tensor.storage = std::make_shared<Storage>(std::move(device));
  tensor.dtype = dtype;
  tensor.strides = ContiguousStrides(shape);
  tensor.shape = std::move(shape);
  tensor.name = name;
  return tensor;
}

StatusOr<std::vector<uint8_t>> GatherViewBytes(std::span<const uint8_t> bytes,
                                               int64_t first_byte,
                                               const Tensor& view) {
  OFFLOAD_RETURN_IF_ERROR(CheckGeometry(view));
  std::vector<uint8_t> out;
  const int64_t numel = view.numel();
  if (numel == 0) return out;
  const int64_t element = view.element_size();
  auto [begin, end] = view.ByteExtent();
  if (begin < first_byte ||
      end > first_byte + static_cast<int64_t>(bytes.size())) {
    return InvalidArgumentError(
        "GatherViewBytes: " + view.Describe() + " reaches bytes [" +
        std::to_string(begin) + ", " + std::to_string(end) +
        ") but only [" + std::to_string(first_byte) + ", " +
        std::to_string(first_byte + static_cast<int64_t>(bytes.size())) +
        ") are given");
  }
  out.resize(static_cast<size_t>(numel * element));
  const size_t rank = view.shape.size();
  std::vector<int64_t> index(rank, 0);
  int64_t position = view.offset;  // in elements, follows `index`
  for (int64_t n = 0; n < numel; ++n) {
    std::memcpy(out.data() + n * element,
                bytes.data() + (position * element - first_byte), element);
    // Odometer step in row-major order.
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < view.shape[d]) {
        position += view.strides[d];
        break;
      }
      position -= (view.shape[d] - 1) * view.strides[d];
      index[d] = 0;
    }
  }
  return out;
}

std::vector<uint8_t> PatternTensorBytes(const Tensor& view, uint64_t seed) {
  if (!CheckGeometry(view).ok() || view.numel() == 0) return {};
  auto [begin, end] = view.ByteExtent();
  std::vector<uint8_t> storage = PatternBytes(begin, end, seed);
  StatusOr<std::vector<uint8_t>> bytes = GatherViewBytes(storage, begin, view);
  if (!bytes.ok()) return {};
  return std::move(bytes).value();
}

StatusOr<std::vector<uint8_t>> ReadTensorBytes(Backend& backend,
                                               const Tensor& tensor) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  Stream& compute = backend.ComputeStream();
  auto [begin, end] = tensor.ByteExtent();
  const auto* base = static_cast<const uint8_t*>(tensor.storage->data());
  if (tensor.ready != nullptr) {
    OFFLOAD_RETURN_IF_ERROR(compute.Wait(*tensor.ready));
  }
  if (tensor.numel() == 0) return std::vector<uint8_t>();
  if (tensor.storage->space() == MemorySpace::kPinnedHost) {
    OFFLOAD_RETURN_IF_ERROR(compute.Synchronize());
    return GatherViewBytes(
        std::span<const uint8_t>(base + begin, static_cast<size_t>(end - begin)),
        begin, tensor);
  }
  OFFLOAD_ASSIGN_OR_RETURN(Buffer pinned, backend.AllocatePinned(end - begin));
  OFFLOAD_RETURN_IF_ERROR(compute.Copy(pinned.data(), base + begin, end - begin));
  // After this the copy has completed, so dropping `pinned` is safe.
  OFFLOAD_RETURN_IF_ERROR(compute.Synchronize());
  return GatherViewBytes(
      std::span<const uint8_t>(static_cast<const uint8_t*>(pinned.data()),
                               static_cast<size_t>(end - begin)),
      begin, tensor);
}

StatusOr<Tensor> Slice(const Tensor& tensor, int dim, int64_t start,
                       int64_t stop, int64_t step) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  OFFLOAD_ASSIGN_OR_RETURN(size_t d, Dim(tensor, dim, "Slice"));
  const int64_t size = tensor.shape[d];
  if (step < 1 || start < 0 || start > stop || stop > size) {
    return InvalidArgumentError(
        "Slice: [" + std::to_string(start) + ":" + std::to_string(stop) + ":" +
        std::to_string(step) + "] along dimension " + std::to_string(dim) +
        " of " + tensor.Describe() + " (need 0 <= start <= stop <= " +
        std::to_string(size) + ", step >= 1)");
  }
  Tensor out = tensor;
  out.shape[d] = (stop - start + step - 1) / step;
  out.strides[d] = tensor.strides[d] * step;
  // An empty slice keeps the offset inside the storage.
  if (out.shape[d] > 0) out.offset += start * tensor.strides[d];
  out.name = tensor.name + ".slice(" + std::to_string(dim) + "," +
             std::to_string(start) + ":" + std::to_string(stop) + ":" +
             std::to_string(step) + ")";
  return out;
}

StatusOr<Tensor> Select(const Tensor& tensor, int dim, int64_t index) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  OFFLOAD_ASSIGN_OR_RETURN(size_t d, Dim(tensor, dim, "Select"));
  if (index < 0 || index >= tensor.shape[d]) {
    return InvalidArgumentError("Select: index " + std::to_string(index) +
                                " along dimension " + std::to_string(dim) +
                                " of " + tensor.Describe());
  }
  Tensor out = tensor;
  out.offset += index * tensor.strides[d];
  out.shape.erase(out.shape.begin() + d);
  out.strides.erase(out.strides.begin() + d);
  out.name = tensor.name + ".select(" + std::to_string(dim) + "," +
             std::to_string(index) + ")";
  return out;
}

StatusOr<Tensor> Transpose(const Tensor& tensor, int d0, int d1) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  OFFLOAD_ASSIGN_OR_RETURN(size_t a, Dim(tensor, d0, "Transpose"));
  OFFLOAD_ASSIGN_OR_RETURN(size_t b, Dim(tensor, d1, "Transpose"));
  Tensor out = tensor;
  std::swap(out.shape[a], out.shape[b]);
  std::swap(out.strides[a], out.strides[b]);
  out.name = tensor.name + ".transpose(" + std::to_string(d0) + "," +
             std::to_string(d1) + ")";
  return out;
}

StatusOr<Tensor> Permute(const Tensor& tensor, const std::vector<int>& dims) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  const size_t rank = tensor.shape.size();
  std::vector<bool> seen(rank, false);
  bool valid = dims.size() == rank;
  for (size_t i = 0; valid && i < rank; ++i) {
    valid = dims[i] >= 0 && static_cast<size_t>(dims[i]) < rank &&
            !seen[dims[i]];
    if (valid) seen[dims[i]] = true;
  }
  std::string text;
  for (size_t i = 0; i < dims.size(); ++i) {
    text += (i > 0 ? "," : "") + std::to_string(dims[i]);
  }
  if (!valid) {
    return InvalidArgumentError("Permute: (" + text +
                                ") is not a permutation of the dimensions of " +
                                tensor.Describe());
  }
  Tensor out = tensor;
  for (size_t i = 0; i < rank; ++i) {
    out.shape[i] = tensor.shape[dims[i]];
    out.strides[i] = tensor.strides[dims[i]];
  }
  out.name = tensor.name + ".permute(" + text + ")";
  return out;
}

StatusOr<Tensor> Reshape(const Tensor& tensor, std::vector<int64_t> shape) {
  OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
  if (!tensor.IsContiguous()) {
    return InvalidArgumentError("Reshape: " + tensor.Describe() +
                                " is not contiguous (a reshape would copy)");
  }
  int64_t numel = 1;
  bool valid = true;
  for (int64_t size : shape) {
    valid = valid && size >= 0 && !__builtin_mul_overflow(numel, size, &numel);
  }
  if (!valid || numel != tensor.numel()) {
    return InvalidArgumentError("Reshape: " + tensor.Describe() + " to " +
                                ListText(shape) +
                                ": element counts differ or a size is invalid");
  }
  Tensor out = tensor;
  out.strides = ContiguousStrides(shape);
  out.shape = std::move(shape);
  out.name = tensor.name + ".view(" + ListText(out.shape) + ")";
  return out;
}

StatusOr<StridedBaseViews> MakeAttentionOutput(Backend& backend, DType dtype,
                                               int64_t batch, int64_t seq,
                                               int64_t heads, int64_t head_dim,
                                               uint64_t seed) {
  if (batch < 1 || seq < 1 || heads < 1 || head_dim < 1) {
    return InvalidArgumentError(
        "MakeAttentionOutput: sizes must be >= 1, got B=" +
        std::to_string(batch) + " S=" + std::to_string(seq) + " H=" +
        std::to_string(heads) + " D=" + std::to_string(head_dim));
  }
  StridedBaseViews views;
  OFFLOAD_ASSIGN_OR_RETURN(
      views.storage_view,
      MakeDeviceTensor(backend, dtype, {batch, seq, heads, head_dim}, seed));
  views.storage_view.name = "attn_out" + std::to_string(seed);
  OFFLOAD_ASSIGN_OR_RETURN(views.base, Transpose(views.storage_view, 1, 2));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor back, Transpose(views.base, 1, 2));
  OFFLOAD_ASSIGN_OR_RETURN(views.view,
                           Reshape(back, {batch, seq, heads * head_dim}));
  return views;
}

}  // namespace offload
