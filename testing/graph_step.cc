#include "testing/graph_step.h"

#include <cstring>
#include <utility>

#include "workload/layer_loop.h"
#include "workload/pattern_bytes.h"

namespace offload {
namespace {

uint64_t Seed(uint64_t epoch, int layer, size_t save) {
  return epoch * 1'000'003 + static_cast<uint64_t>(layer) * 1'009 + save;
}

std::string Where(const char* call, int layer) {
  return std::string(call) + " of layer " + std::to_string(layer);
}

}  // namespace

int64_t GraphStepSpec::LayerBytes(int layer) const {
  int64_t total = 0;
  for (int64_t bytes : saves[layer]) total += bytes;
  return total;
}

int64_t GraphStepSpec::CheckedBytes() const {
  int64_t total = 0;
  for (int l = 0; l < layers(); ++l) {
    total += LayerBytes(l);
    if (repeat_first && !saves[l].empty()) total += saves[l][0];
  }
  return total;
}

Status EnqueueGraphStep(SimBackend& sim, Offloader& offloader,
                        const GraphStepSpec& spec, GraphStepInputs& inputs) {
  const int n = spec.layers();
  if (n == 0) return InvalidArgumentError("EnqueueGraphStep: no layers");
  for (const auto& layer : spec.saves) {
    for (int64_t bytes : layer) {
      if (bytes <= 0) {
        return InvalidArgumentError("EnqueueGraphStep: a save of size <= 0");
      }
    }
  }
  const bool store = sim.options().store_bytes;
  const std::shared_ptr<GraphStepInputs::State> state = inputs.state();
  Stream& compute = sim.ComputeStream();
  const int k = spec.manual ? spec.manual_offloaded : 0;
  std::vector<std::vector<SavedTensor>> saved(n);

  // The loop (ForwardStep .. FinishBackward) is RunLayerStep's; the hooks
  // add the step's kernels, pushes, pops and manual calls.
  LayerLoopHooks hooks;
  hooks.forward = [&](int l) -> Status {
    if (spec.manual && l >= 2 && l - 2 < k) {
      OFFLOAD_RETURN_IF_ERROR(offloader.ReleaseForwardMemory(l - 2).WithContext(
          Where("ReleaseForwardMemory", l - 2)));
    }
    std::vector<Tensor> tensors;
    SimKernel forward;
    forward.name = "forward L" + std::to_string(l);
    forward.duration_ns = spec.forward_ns;
    std::vector<std::pair<void*, int64_t>> targets;
    for (size_t j = 0; j < spec.saves[l].size(); ++j) {
      const int64_t bytes = spec.saves[l][j];
      OFFLOAD_ASSIGN_OR_RETURN(Buffer buffer,
                               sim.AllocateDevice(bytes, compute));
      forward.writes.push_back(SimRange{buffer.data(), bytes});
      targets.emplace_back(buffer.data(), bytes);
      Tensor tensor;
      tensor.storage = std::make_shared<Storage>(std::move(buffer));
      tensor.dtype = DType::kU8;
      tensor.shape = {bytes};
      tensor.strides = {1};
      tensor.name = "L" + std::to_string(l) + ".s" + std::to_string(j);
      tensors.push_back(std::move(tensor));
    }
    if (store) {
      forward.body = [state, targets, l](SimBackend& s) {
        for (size_t j = 0; j < targets.size(); ++j) {
          StatusOr<uint8_t*> bytes =
              s.MutableBytes(targets[j].first, targets[j].second);
          if (bytes.ok()) {
            FillPattern(*bytes, targets[j].second, Seed(state->epoch, l, j));
          }
        }
      };
    }
    OFFLOAD_RETURN_IF_ERROR(sim.EnqueueKernel(compute, std::move(forward)));
    for (size_t j = 0; j < tensors.size(); ++j) {
      OFFLOAD_ASSIGN_OR_RETURN(SavedTensor handle, offloader.Push(tensors[j]));
      saved[l].push_back(std::move(handle));
      if (j == 0 && spec.repeat_first) {
        OFFLOAD_ASSIGN_OR_RETURN(SavedTensor again, offloader.Push(tensors[j]));
        saved[l].push_back(std::move(again));
      }
    }
    tensors.clear();  // as autograd: only the saved handles keep them
    if (spec.manual && l < k) {
      OFFLOAD_RETURN_IF_ERROR(
          offloader.StartOffload(l).WithContext(Where("StartOffload", l)));
    }
    return OkStatus();
  };
  hooks.after_forward = [&]() -> Status {
    if (spec.manual) {
      for (int l = std::max(0, n - 2); l < k; ++l) {
        OFFLOAD_RETURN_IF_ERROR(offloader.ReleaseForwardMemory(l).WithContext(
            Where("ReleaseForwardMemory", l)));
      }
    }
    return OkStatus();
  };
  hooks.backward = [&](int l) -> Status {
    if (spec.manual && l - 1 >= 0 && l - 1 < k) {
      OFFLOAD_RETURN_IF_ERROR(
          offloader.StartReload(l - 1).WithContext(Where("StartReload", l - 1)));
    }
    SimKernel backward;
    backward.name = "backward L" + std::to_string(l);
    backward.duration_ns = spec.backward_ns;
    struct Check {
      const void* data;
      int64_t bytes;
      uint64_t save;
    };
    std::vector<Check> checks;
    std::vector<Tensor> popped;
    size_t save = 0;
    for (size_t i = 0; i < saved[l].size(); ++i) {
      OFFLOAD_ASSIGN_OR_RETURN(Tensor tensor, offloader.Pop(saved[l][i]));
      const int64_t bytes = tensor.nbytes();
      const void* data = static_cast<const uint8_t*>(tensor.storage->data()) +
                         tensor.offset;
      backward.reads.push_back(SimRange{data, bytes});
      checks.push_back(Check{data, bytes, save});
      popped.push_back(std::move(tensor));
      if (!(spec.repeat_first && i == 0)) ++save;
    }
    if (store) {
      backward.body = [state, checks, l](SimBackend& s) {
        for (const Check& check : checks) {
          StatusOr<uint8_t*> bytes = s.MutableBytes(check.data, check.bytes);
          const std::vector<uint8_t> expected = PatternBytes(
              0, check.bytes, Seed(state->epoch, l, check.save));
          if (!bytes.ok() ||
              std::memcmp(*bytes, expected.data(), check.bytes) != 0) {
            state->mismatches.push_back(
                "epoch " + std::to_string(state->epoch) + " L" +
                std::to_string(l) + ".s" + std::to_string(check.save) +
                (bytes.ok() ? ": bytes differ" : ": " + bytes.status().ToString()));
          }
          state->checked_bytes += check.bytes;
        }
      };
    }
    OFFLOAD_RETURN_IF_ERROR(sim.EnqueueKernel(compute, std::move(backward)));
    popped.clear();
    saved[l].clear();
    return OkStatus();
  };
  return RunLayerStep(offloader, n, hooks);
}

}  // namespace offload
