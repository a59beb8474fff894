#include "workload/sim_compute.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "workload/pattern_bytes.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

SimRange RangeOf(const Tensor& tensor) {
  auto [begin, end] = tensor.ByteExtent();
  return SimRange{static_cast<const uint8_t*>(tensor.storage->data()) + begin,
                  end - begin};
}

}  // namespace

std::vector<SimRange> SimRanges(const std::vector<const Tensor*>& tensors) {
  std::vector<SimRange> ranges;
  for (const Tensor* tensor : tensors) {
    if (tensor->numel() > 0) ranges.push_back(RangeOf(*tensor));
  }
  return ranges;
}

ComputeFn SimCompute(SimBackend& sim) {
  return [&sim](Stream& stream, const ComputeCall& call) {
    SimKernel kernel;
    kernel.name = call.name;
    kernel.duration_ns = call.duration_ns;
    kernel.reads = SimRanges(call.reads);
    kernel.writes = SimRanges(call.writes);
    return sim.EnqueueKernel(stream, std::move(kernel));
  };
}

MakeTensorFn SimMakeTensor(SimBackend& sim) {
  return [&sim](Backend& backend, DType dtype, std::vector<int64_t> shape,
                uint64_t seed) -> StatusOr<Tensor> {
    if (&backend != &sim) {
      return InvalidArgumentError("SimMakeTensor: called with another backend");
    }
    int64_t bytes = DTypeSize(dtype);
    for (int64_t size : shape) {
      if (size < 0 || __builtin_mul_overflow(bytes, size, &bytes)) {
        return InvalidArgumentError("SimMakeTensor: invalid shape");
      }
    }
    const std::string name = "pattern" + std::to_string(seed);
    Stream& compute = sim.ComputeStream();
    OFFLOAD_ASSIGN_OR_RETURN(
        Buffer device,
        sim.AllocateDevice(bytes > 0 ? bytes : DTypeSize(dtype), compute));
    if (bytes > 0) {
      SimKernel fill;
      fill.name = "fill " + name;
      fill.writes.push_back(SimRange{device.data(), bytes});
      if (sim.options().store_bytes) {
        fill.body = [data = device.data(), bytes, seed](SimBackend& s) {
          StatusOr<uint8_t*> target = s.MutableBytes(data, bytes);
          if (target.ok()) FillPattern(*target, bytes, seed);
        };
      }
      OFFLOAD_RETURN_IF_ERROR(sim.EnqueueKernel(compute, std::move(fill)));
    }
    Tensor tensor;
    tensor.storage = std::make_shared<Storage>(std::move(device));
    tensor.dtype = dtype;
    tensor.strides = ContiguousStrides(shape);
    tensor.shape = std::move(shape);
    tensor.name = name;
    return tensor;
  };
}

CaptureFn SimCapture(SimBackend& sim) {
  return [&sim](Backend& backend,
                const Tensor& tensor) -> StatusOr<BytesFuture> {
    if (&backend != &sim) {
      return InvalidArgumentError("SimCapture: called with another backend");
    }
    OFFLOAD_RETURN_IF_ERROR(ValidateTensor(tensor));
    Tensor geometry = tensor;
    geometry.storage = nullptr;
    geometry.ready = nullptr;
    if (!sim.options().store_bytes) {
      return BytesFuture([]() -> StatusOr<std::vector<uint8_t>> {
        return FailedPreconditionError(
            "SimCapture: the simulator stores no bytes");
      });
    }
    if (tensor.numel() == 0) {
      return BytesFuture([]() -> StatusOr<std::vector<uint8_t>> {
        return std::vector<uint8_t>();
      });
    }
    auto [begin, end] = tensor.ByteExtent();
    auto captured = std::make_shared<std::optional<std::vector<uint8_t>>>();
    SimKernel check;
    check.name = "check " + tensor.name;
    const SimRange range = RangeOf(tensor);
    check.reads.push_back(range);
    check.body = [captured, range](SimBackend& s) {
      StatusOr<uint8_t*> bytes = s.MutableBytes(range.data, range.bytes);
      if (bytes.ok()) captured->emplace(*bytes, *bytes + range.bytes);
    };
    OFFLOAD_RETURN_IF_ERROR(
        sim.EnqueueKernel(sim.ComputeStream(), std::move(check)));
    return BytesFuture([captured, geometry, begin = begin,
                        name = tensor.name]() -> StatusOr<std::vector<uint8_t>> {
      if (!captured->has_value()) {
        return InternalError("SimCapture: the check of '" + name +
                             "' has not run (synchronize first)");
      }
      return GatherViewBytes(**captured, begin, geometry);
    });
  };
}

WorkloadHooks SimWorkloadHooks(SimBackend& sim) {
  WorkloadHooks hooks;
  hooks.compute = SimCompute(sim);
  hooks.make_tensor = SimMakeTensor(sim);
  hooks.capture = SimCapture(sim);
  hooks.clock = [&sim] { return sim.NowNs(); };
  return hooks;
}

}  // namespace offload
