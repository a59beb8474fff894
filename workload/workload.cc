#include "workload/workload.h"

#include <optional>
#include <string>
#include <utility>

#include "workload/layer_loop.h"
#include "workload/tensor_util.h"

namespace offload {

StatusOr<WorkloadHooks> CompleteHooks(const WorkloadHooks& hooks,
                                      const std::string& caller) {
  if (!hooks.compute) {
    return InvalidArgumentError(caller + ": no compute hook");
  }
  WorkloadHooks complete = hooks;
  if (!complete.make_tensor) complete.make_tensor = MakeDeviceTensor;
  if (!complete.capture) complete.capture = CaptureByCopy;
  return complete;
}

std::string Mismatch::ToString() const {
  return "iteration " + std::to_string(iteration) + " layer " +
         std::to_string(layer) + " '" + tensor + "': " + what;
}

// ---------------------------------------------------------------------------
// The driver.

namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Seed of buffer `buffer` of `layer` in `iteration` (-1: persistent).
uint64_t BufferSeed(uint64_t seed, int64_t iteration, int layer, int buffer) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(iteration + 2)) ^
             (static_cast<uint64_t>(layer) << 20) ^
             static_cast<uint64_t>(buffer));
}

bool SameFlags(const TensorFlags& a, const TensorFlags& b) {
  return a.parameter == b.parameter && a.weight == b.weight &&
         a.do_not_offload == b.do_not_offload &&
         a.offload_base == b.offload_base;
}

// What a pushed tensor (or composite component) must look like when popped.
struct Expected {
  std::string name;
  Tensor geometry;  // as pushed, without storage or ready event
  uint64_t seed = 0;
  bool must_be_kept = false;
  const Storage* storage = nullptr;  // identity only; valid if must_be_kept
};

struct Pushed {
  SavedTensor handle;
  bool composite = false;
  std::string name;
  std::vector<std::optional<Expected>> components;
  std::vector<uint8_t> metadata;
};

struct PendingCheck {
  int layer = 0;
  Expected expected;
  BytesFuture bytes;
};

class Driver {
 public:
  Driver(Backend& backend, Offloader& offloader, const WorkloadSpec& spec,
         const WorkloadHooks& hooks, const WorkloadOptions& options)
      : backend_(backend),
        offloader_(offloader),
        spec_(spec),
        hooks_(hooks),
        options_(options) {}

  // Makes the persistent buffers.
  Status Init() {
    persistent_.resize(spec_.layers.size());
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      const LayerSpec& layer = spec_.layers[i];
      persistent_[i].resize(layer.buffers.size());
      for (size_t b = 0; b < layer.buffers.size(); ++b) {
        if (!layer.buffers[b].persistent) continue;
        OFFLOAD_ASSIGN_OR_RETURN(
            persistent_[i][b],
            MakeBuffer(static_cast<int>(i), static_cast<int>(b), -1));
      }
    }
    return OkStatus();
  }

  // Runs one iteration; appends its mismatches and counts to `result`.
  Status RunIteration(int iteration, WorkloadResult& result) {
    Status status = Iteration(iteration, result);
    if (!status.ok()) {
      // Pending captures may still be read by the device: let it finish
      // before they are dropped.
      (void)backend_.ComputeStream().Synchronize();
      pending_.clear();
    }
    return status;
  }

 private:
  void Notify(WorkloadPhase phase, int iteration, int layer) {
    if (hooks_.observer) hooks_.observer(WorkloadEvent{phase, iteration, layer});
  }

  StatusOr<Tensor> MakeBuffer(int layer, int buffer, int64_t iteration) {
    const BufferSpec& spec = spec_.layers[layer].buffers[buffer];
    const uint64_t seed = BufferSeed(spec_.seed, iteration, layer, buffer);
    StatusOr<Tensor> tensor =
        hooks_.make_tensor(backend_, spec.dtype, spec.shape, seed);
    if (!tensor.ok()) {
      return tensor.status().WithContext("layer " + std::to_string(layer) +
                                         " buffer '" + spec.name + "'");
    }
    tensor->name = "L" + std::to_string(layer) + "." + spec.name;
    return tensor;
  }

  // The expectation for `view` of buffer `buffer` of `layer`.
  Expected Expect(int layer, const Tensor& view, uint64_t seed) const {
    Expected expected;
    expected.name = view.name;
    expected.geometry = view;
    expected.geometry.storage = nullptr;
    expected.geometry.ready = nullptr;
    expected.seed = seed;
    expected.storage = view.storage.get();
    expected.must_be_kept =
        options_.min_offload_elements >= 0 &&
        (view.flags.parameter || view.flags.weight ||
         view.flags.do_not_offload ||
         view.numel() < options_.min_offload_elements ||
         !offloader_.WillOffload(layer));
    return expected;
  }

  // The forward of layer `i` after its ForwardStep: makes its buffers, runs
  // its compute, pushes its saves into `pushed`. Errors name the call.
  Status ForwardLayer(int iteration, int i, std::vector<Pushed>& pushed) {
    const LayerSpec& layer = spec_.layers[i];
    Stream& compute = backend_.ComputeStream();
    // The driver's own references: dropped at the end of this scope.
    std::vector<Tensor> buffers(layer.buffers.size());
    std::vector<uint64_t> seeds(layer.buffers.size());
    for (size_t b = 0; b < layer.buffers.size(); ++b) {
      const bool persistent = layer.buffers[b].persistent;
      seeds[b] = BufferSeed(spec_.seed, persistent ? -1 : iteration, i,
                            static_cast<int>(b));
      if (persistent) {
        buffers[b] = persistent_[i][b];
      } else {
        OFFLOAD_ASSIGN_OR_RETURN(buffers[b],
                                 MakeBuffer(i, static_cast<int>(b), iteration));
      }
    }
    Notify(WorkloadPhase::kBuffersMade, iteration, i);
    ComputeCall forward{"forward L" + std::to_string(i), layer.forward_ns,
                        {}, {}};
    for (size_t b = 0; b < buffers.size(); ++b) {
      if (buffers[b].numel() == 0) continue;
      (layer.buffers[b].persistent ? forward.reads : forward.writes)
          .push_back(&buffers[b]);
    }
    OFFLOAD_RETURN_IF_ERROR(
        hooks_.compute(compute, forward).WithContext("forward compute"));
    Notify(WorkloadPhase::kForwardComputed, iteration, i);

    for (const SaveSpec& save : layer.saves) {
      const std::string name = "L" + std::to_string(i) + "." + save.name;
      Pushed entry;
      entry.composite = save.composite;
      entry.name = name;
      entry.metadata = save.metadata;
      CompositeTensor composite;
      composite.name = name;
      composite.metadata = save.metadata;
      for (size_t c = 0; c < save.components.size(); ++c) {
        const std::optional<ViewSpec>& component = save.components[c];
        if (!component.has_value()) {
          composite.components.push_back(std::nullopt);
          entry.components.push_back(std::nullopt);
          continue;
        }
        StatusOr<Tensor> view =
            ApplyViewOps(buffers[component->buffer], component->ops);
        if (!view.ok()) return view.status().WithContext("view '" + name + "'");
        view->flags = component->flags;
        view->name =
            save.composite ? name + "." + std::to_string(c) : name;
        entry.components.push_back(
            Expect(i, *view, seeds[component->buffer]));
        composite.components.push_back(std::move(view).value());
      }
      StatusOr<SavedTensor> handle =
          save.composite ? offloader_.Push(composite)
                         : offloader_.Push(*composite.components[0]);
      if (!handle.ok()) {
        return handle.status().WithContext("Push '" + name + "'");
      }
      entry.handle = std::move(handle).value();
      pushed.push_back(std::move(entry));
    }
    Notify(WorkloadPhase::kPushed, iteration, i);
    return OkStatus();
  }

  // The backward of layer `i` after its BackwardStep: pops `pushed`, runs
  // its compute, checks the popped tensors and enqueues their captures.
  Status BackwardLayer(int iteration, int i, std::vector<Pushed>& pushed,
                       WorkloadResult& result) {
    const LayerSpec& layer = spec_.layers[i];
    Stream& compute = backend_.ComputeStream();
    // Popped tensors with their expectations; dropped after this layer.
    std::vector<std::pair<Tensor, const Expected*>> popped;
    for (Pushed& entry : pushed) {
      if (!entry.composite) {
        StatusOr<Tensor> tensor = offloader_.Pop(entry.handle);
        if (!tensor.ok()) {
          return tensor.status().WithContext("Pop '" + entry.name + "'");
        }
        popped.emplace_back(std::move(tensor).value(),
                            &*entry.components[0]);
        continue;
      }
      StatusOr<CompositeTensor> composite =
          offloader_.PopComposite(entry.handle);
      if (!composite.ok()) {
        return composite.status().WithContext("PopComposite '" + entry.name +
                                              "'");
      }
      CheckComposite(iteration, i, entry, *composite, result, popped);
    }
    Notify(WorkloadPhase::kPopped, iteration, i);
    ComputeCall backward{"backward L" + std::to_string(i), layer.backward_ns,
                         {}, {}};
    for (const auto& [tensor, expected] : popped) {
      if (tensor.numel() > 0) backward.reads.push_back(&tensor);
    }
    OFFLOAD_RETURN_IF_ERROR(
        hooks_.compute(compute, backward).WithContext("backward compute"));
    Notify(WorkloadPhase::kBackwardComputed, iteration, i);
    for (const auto& [tensor, expected] : popped) {
      if (!CheckGeometry(iteration, i, tensor, *expected, result)) continue;
      if (!options_.check_bytes) continue;
      StatusOr<BytesFuture> future = hooks_.capture(backend_, tensor);
      if (!future.ok()) {
        return future.status().WithContext("capture '" + expected->name + "'");
      }
      pending_.push_back(
          PendingCheck{i, *expected, std::move(future).value()});
    }
    // Autograd frees the saved tensors once the layer's backward is done.
    popped.clear();
    pushed.clear();
    return OkStatus();
  }

  Status Iteration(int iteration, WorkloadResult& result) {
    const int n = static_cast<int>(spec_.layers.size());
    const int64_t begin_ns = hooks_.clock ? hooks_.clock() : 0;
    Stream& compute = backend_.ComputeStream();
    std::vector<std::vector<Pushed>> pushed(n);
    LayerLoopHooks loop;
    loop.before_call = [&](LayerCall call, int layer) {
      if (call == LayerCall::kForwardStep) {
        Notify(WorkloadPhase::kForwardBegin, iteration, layer);
      } else if (call == LayerCall::kBackwardStep) {
        Notify(WorkloadPhase::kBackwardBegin, iteration, layer);
      }
    };
    loop.forward = [&](int layer) {
      return ForwardLayer(iteration, layer, pushed[layer]);
    };
    loop.backward = [&](int layer) {
      return BackwardLayer(iteration, layer, pushed[layer], result);
    };
    const Status step = RunLayerStep(offloader_, n, loop);
    if (!step.ok()) {
      // "iteration 2 layer 3 forward: ...", as the driver names the layer.
      return Status(step.code(),
                    "iteration " + std::to_string(iteration) + " " +
                        step.message());
    }
    OFFLOAD_RETURN_IF_ERROR(compute.Synchronize());
    if (hooks_.clock) result.iteration_ns.push_back(hooks_.clock() - begin_ns);

    for (PendingCheck& check : pending_) {
      StatusOr<std::vector<uint8_t>> got = check.bytes();
      if (!got.ok()) {
        return got.status().WithContext(
            "iteration " + std::to_string(iteration) + " layer " +
            std::to_string(check.layer) + " reading '" + check.expected.name +
            "'");
      }
      std::vector<uint8_t> want =
          PatternTensorBytes(check.expected.geometry, check.expected.seed);
      if (options_.tamper_expected) {
        options_.tamper_expected(iteration, check.layer, check.expected.name,
                                 want);
      }
      ++result.tensors_checked;
      result.bytes_checked += static_cast<int64_t>(want.size());
      CompareBytes(iteration, check.layer, check.expected.name, *got, want,
                   result);
    }
    pending_.clear();
    ++result.iterations;
    Notify(WorkloadPhase::kIterationEnd, iteration, -1);
    return OkStatus();
  }

  // Checks a popped composite's name, metadata and component presence, and
  // adds its present components to `popped`.
  void CheckComposite(
      int iteration, int layer, const Pushed& entry, CompositeTensor& composite,
      WorkloadResult& result,
      std::vector<std::pair<Tensor, const Expected*>>& popped) {
    auto mismatch = [&](std::string what) {
      result.mismatches.push_back(
          Mismatch{iteration, layer, entry.name, std::move(what)});
    };
    if (composite.name != entry.name) {
      mismatch("composite popped with name '" + composite.name + "'");
    }
    if (composite.metadata != entry.metadata) {
      mismatch("composite metadata differs");
    }
    if (composite.components.size() != entry.components.size()) {
      mismatch("composite has " + std::to_string(composite.components.size()) +
               " components, pushed " +
               std::to_string(entry.components.size()));
      return;
    }
    for (size_t c = 0; c < entry.components.size(); ++c) {
      const bool want = entry.components[c].has_value();
      const bool got = composite.components[c].has_value();
      if (want != got) {
        mismatch("component " + std::to_string(c) +
                 (want ? " is missing" : " appeared"));
        continue;
      }
      if (want) {
        popped.emplace_back(std::move(*composite.components[c]),
                            &*entry.components[c]);
      }
    }
  }

  // Compares a popped tensor's metadata with what was pushed; false (and a
  // mismatch) if its bytes cannot be compared.
  bool CheckGeometry(int iteration, int layer, const Tensor& got,
                     const Expected& want, WorkloadResult& result) {
    auto mismatch = [&](std::string what) {
      result.mismatches.push_back(
          Mismatch{iteration, layer, want.name, std::move(what)});
    };
    const Tensor& g = want.geometry;
    Status valid = ValidateTensor(got);
    if (!valid.ok()) {
      mismatch("malformed: " + valid.ToString());
      return false;
    }
    const bool strides_ok =
        got.strides == g.strides ||
        (options_.allow_made_contiguous && got.IsContiguous());
    if (got.dtype != g.dtype || got.shape != g.shape || !strides_ok) {
      mismatch("popped as " + got.Describe() + ", pushed " + g.Describe());
      return false;
    }
    if (got.name != g.name) mismatch("popped with name '" + got.name + "'");
    if (!SameFlags(got.flags, g.flags)) mismatch("flags changed");
    if (got.storage->space() != MemorySpace::kDevice) {
      mismatch("popped outside device memory");
    }
    if (want.must_be_kept) {
      if (got.storage.get() != want.storage || got.offset != g.offset) {
        mismatch("must not be offloaded but came back as another view " +
                 got.Describe());
      } else {
        ++result.tensors_kept;
      }
    }
    return true;
  }

  void CompareBytes(int iteration, int layer, const std::string& name,
                    const std::vector<uint8_t>& got,
                    const std::vector<uint8_t>& want, WorkloadResult& result) {
    if (got.size() != want.size()) {
      result.mismatches.push_back(Mismatch{
          iteration, layer, name,
          "read " + std::to_string(got.size()) + " bytes, want " +
              std::to_string(want.size())});
      return;
    }
    size_t differing = 0, first = 0;
    for (size_t b = 0; b < got.size(); ++b) {
      if (got[b] != want[b] && differing++ == 0) first = b;
    }
    if (differing == 0) return;
    result.mismatches.push_back(Mismatch{
        iteration, layer, name,
        std::to_string(differing) + " of " + std::to_string(got.size()) +
            " bytes differ; the first at logical byte " +
            std::to_string(first) + ": got " + std::to_string(got[first]) +
            ", want " + std::to_string(want[first])});
  }

  Backend& backend_;
  Offloader& offloader_;
  const WorkloadSpec& spec_;
  const WorkloadHooks& hooks_;  // complete (CompleteHooks)
  const WorkloadOptions& options_;
  std::vector<std::vector<Tensor>> persistent_;  // [layer][buffer]
  std::vector<PendingCheck> pending_;
};

}  // namespace

StatusOr<WorkloadResult> RunWorkload(Backend& backend, Offloader& offloader,
                                     const WorkloadSpec& spec,
                                     const WorkloadHooks& hooks,
                                     const WorkloadOptions& options) {
  OFFLOAD_RETURN_IF_ERROR(ValidateWorkloadSpec(spec));
  OFFLOAD_ASSIGN_OR_RETURN(WorkloadHooks complete,
                           CompleteHooks(hooks, "RunWorkload"));
  if (options.iterations < 0) {
    return InvalidArgumentError("RunWorkload: negative iteration count");
  }
  Driver driver(backend, offloader, spec, complete, options);
  OFFLOAD_RETURN_IF_ERROR(driver.Init());
  WorkloadResult result;
  for (int it = 0; it < options.iterations; ++it) {
    OFFLOAD_RETURN_IF_ERROR(driver.RunIteration(it, result));
  }
  return result;
}

}  // namespace offload
