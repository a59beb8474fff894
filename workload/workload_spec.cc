#include "workload/workload_spec.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

namespace offload {

namespace {

int64_t BufferBytes(const BufferSpec& buffer) {
  int64_t bytes = DTypeSize(buffer.dtype);
  for (int64_t size : buffer.shape) bytes *= size;
  return bytes;
}

}  // namespace

int64_t WorkloadSpec::ActivationBytes(int layer) const {
  int64_t bytes = 0;
  for (const BufferSpec& buffer : layers[layer].buffers) {
    if (!buffer.persistent) bytes += BufferBytes(buffer);
  }
  return bytes;
}

int64_t WorkloadSpec::TotalActivationBytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    bytes += ActivationBytes(static_cast<int>(i));
  }
  return bytes;
}

Status ValidateWorkloadSpec(const WorkloadSpec& spec) {
  if (spec.layers.empty()) {
    return InvalidArgumentError("workload spec has no layers");
  }
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    const std::string where = "workload spec layer " + std::to_string(i);
    if (layer.forward_ns < 0 || layer.backward_ns < 0) {
      return InvalidArgumentError(where + ": negative compute duration");
    }
    for (const BufferSpec& buffer : layer.buffers) {
      if (buffer.name.empty()) {
        return InvalidArgumentError(where + ": a buffer has no name");
      }
      for (int64_t size : buffer.shape) {
        if (size < 0) {
          return InvalidArgumentError(where + " buffer '" + buffer.name +
                                      "': negative size");
        }
      }
    }
    for (const SaveSpec& save : layer.saves) {
      if (save.name.empty()) {
        return InvalidArgumentError(where + ": a save has no name");
      }
      int present = 0;
      for (const std::optional<ViewSpec>& component : save.components) {
        if (!component.has_value()) continue;
        ++present;
        if (component->buffer < 0 ||
            static_cast<size_t>(component->buffer) >= layer.buffers.size()) {
          return InvalidArgumentError(
              where + " save '" + save.name + "': buffer index " +
              std::to_string(component->buffer) + " out of range");
        }
      }
      if (!save.composite && (present != 1 || save.components.size() != 1)) {
        return InvalidArgumentError(where + " save '" + save.name +
                                    "': a plain save needs exactly one "
                                    "component");
      }
      if (save.composite && present == 0) {
        return InvalidArgumentError(where + " save '" + save.name +
                                    "': a composite needs a component");
      }
    }
  }
  return OkStatus();
}

WorkloadSpec UniformWorkloadSpec(int layers, int64_t bytes_per_layer,
                                 int tensors_per_layer, int64_t forward_ns,
                                 int64_t backward_ns) {
  WorkloadSpec spec;
  if (layers < 1 || bytes_per_layer < 1 || tensors_per_layer < 1 ||
      forward_ns < 0 || backward_ns < 0) {
    return spec;
  }
  const int64_t elements =
      std::max<int64_t>(1, bytes_per_layer / tensors_per_layer / 2);
  std::vector<int64_t> shape = {elements};
  if (elements % 1024 == 0) shape = {elements / 1024, 1024};
  for (int i = 0; i < layers; ++i) {
    LayerSpec layer;
    layer.forward_ns = forward_ns;
    layer.backward_ns = backward_ns;
    for (int t = 0; t < tensors_per_layer; ++t) {
      const std::string name = "act" + std::to_string(t);
      layer.buffers.push_back(BufferSpec{name, DType::kBF16, shape, false});
      layer.saves.push_back(SaveSpec{name, false, {ViewSpec{t, {}, {}}}, {}});
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

WorkloadSpec RandomWorkloadSpec(uint64_t seed,
                                const RandomSpecOptions& options) {
  WorkloadSpec spec;
  spec.seed = seed;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto pick = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto chance = [&](int percent) { return pick(1, 100) <= percent; };
  const int64_t threshold = std::max<int64_t>(options.min_offload_elements, 1);
  for (int i = 0; i < options.layers; ++i) {
    LayerSpec layer;
    layer.forward_ns = pick(options.min_forward_ns,
                            std::max(options.min_forward_ns,
                                     options.max_forward_ns));
    layer.backward_ns = 2 * layer.forward_ns;
    const int64_t batch = pick(1, 2);
    const int64_t heads = int64_t{1} << pick(1, 2);     // 2 or 4
    const int64_t head_dim = int64_t{8} << pick(0, 1);  // 8 or 16
    const int64_t hidden = heads * head_dim;
    // seq * batch * hidden >= 2 * threshold: the large tensors are offloaded.
    int64_t seq = (2 * threshold + batch * hidden - 1) / (batch * hidden);
    seq = (seq + 7) / 8 * 8 + 8 * pick(0, 2);
    const int64_t tokens = seq * batch;

    auto buffer = [&](std::string name, DType dtype,
                      std::vector<int64_t> shape, bool persistent = false) {
      layer.buffers.push_back(
          BufferSpec{std::move(name), dtype, std::move(shape), persistent});
      return static_cast<int>(layer.buffers.size()) - 1;
    };
    auto save = [&](std::string name, int index, std::vector<ViewOp> ops = {},
                    TensorFlags flags = {}) {
      layer.saves.push_back(SaveSpec{
          std::move(name), false, {ViewSpec{index, std::move(ops), flags}}, {}});
    };

    const int input = buffer("input", DType::kBF16, {seq, batch, hidden});
    save("input", input);

    // Fused qkv, interleaved per head: [s, b, heads, 3 * head_dim].
    const int qkv =
        buffer("qkv", DType::kBF16, {seq, batch, heads, 3 * head_dim});
    const char* parts[] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
      save(std::string("qkv.") + parts[p], qkv,
           {ViewOp::Slice(3, p * head_dim, (p + 1) * head_dim)});
    }
    if (chance(40)) save("qkv", qkv);

    // Attention output: storage [b, s, heads, head_dim]; the kernel's
    // [b, heads, s, head_dim] output is a strided view of it; the next
    // layer saves the contiguous [b, s, hidden] view taken from it.
    const int attn =
        buffer("attn_out", DType::kBF16, {batch, seq, heads, head_dim});
    save("attn_out", attn,
         {ViewOp::Transpose(1, 2), ViewOp::Transpose(1, 2),
          ViewOp::Reshape({batch, seq, hidden})});
    if (chance(50)) save("attn_out.base", attn, {ViewOp::Transpose(1, 2)});

    // MLP activation: saved 1-3 times, and as its transpose.
    const int fc1 = buffer("fc1", DType::kBF16, {tokens, 4 * hidden});
    const int64_t copies = pick(1, 3);
    for (int64_t c = 0; c < copies; ++c) {
      save(c == 0 ? "fc1" : "fc1.again" + std::to_string(c), fc1);
    }
    if (chance(60)) save("fc1.T", fc1, {ViewOp::Transpose(0, 1)});

    // Softmax statistics: small, stays on device.
    const int lse = buffer("softmax_lse", DType::kF32, {batch, heads, seq});
    save("softmax_lse", lse);

    // FP8-style composite: data, transposed data, an absent component
    // sometimes, a one-element scale; metadata describing the recipe.
    const int data = buffer("fp8.data", DType::kFP8E4M3, {tokens, hidden});
    const int data_t = buffer("fp8.data_t", DType::kFP8E4M3, {hidden, tokens});
    const int scale = buffer("fp8.scale_inv", DType::kF32, {1});
    SaveSpec fp8;
    fp8.name = "fp8";
    fp8.composite = true;
    fp8.components.push_back(ViewSpec{data, {}, {}});
    if (chance(30)) {
      fp8.components.push_back(std::nullopt);
    } else {
      fp8.components.push_back(ViewSpec{data_t, {}, {}});
    }
    fp8.components.push_back(ViewSpec{scale, {}, {}});
    fp8.metadata = {static_cast<uint8_t>(i), 0xE4, 0x43,
                    static_cast<uint8_t>(pick(0, 255))};
    layer.saves.push_back(std::move(fp8));

    // Do-not-offload mask, a weight and a parameter.
    const int mask = buffer("mask", DType::kU8, {tokens, 2 * hidden});
    TensorFlags keep;
    keep.do_not_offload = true;
    save("mask", mask, {}, keep);
    const int weight =
        buffer("weight", DType::kBF16, {hidden, hidden}, /*persistent=*/true);
    TensorFlags weight_flags;
    weight_flags.weight = true;
    save("weight", weight, {}, weight_flags);
    const int bias =
        buffer("bias", DType::kF32, {4 * hidden}, /*persistent=*/true);
    TensorFlags parameter;
    parameter.parameter = true;
    save("bias", bias, {}, parameter);

    if (options.sparse_views) {
      // Every 8th row of a large buffer: covers 1/8 of its storage, yet has
      // more elements than the threshold.
      const int big = buffer("sparse_src", DType::kBF16,
                             {8 * ((2 * threshold + hidden - 1) / hidden),
                              hidden});
      save("sparse", big,
           {ViewOp::Slice(0, 0, layer.buffers[big].shape[0], 8)});
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

}  // namespace offload
