// What a layer stack looks like to the workload driver (workload/workload.h):
// the buffers each layer's forward makes, the tensors it saves (views of
// those buffers, plain or composite), and its compute durations. Also the
// spec's checks and two generators: a uniform stack and a transformer-like
// random one.

#ifndef OFFLOAD_WORKLOAD_WORKLOAD_SPEC_H_
#define OFFLOAD_WORKLOAD_WORKLOAD_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/status.h"
#include "engine/tensor.h"
#include "workload/view_ops.h"

namespace offload {

// One storage a layer's forward produces (or, if persistent, a parameter the
// layer uses): a contiguous tensor filled with a pattern.
struct BufferSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  // Made once when the driver starts and held by it for the whole run, like
  // a module's parameters; otherwise made anew in every iteration and held
  // by the driver only during the layer's forward.
  bool persistent = false;
};

// A tensor the layer saves: a view of one of its buffers.
struct ViewSpec {
  int buffer = 0;            // index into LayerSpec::buffers
  std::vector<ViewOp> ops;   // applied to the buffer's contiguous tensor
  TensorFlags flags;         // set on the pushed tensor
};

// One Push: a plain tensor (exactly one present component) or a composite
// (CompositeTensor: components in order, some may be absent, plus metadata).
struct SaveSpec {
  std::string name;
  bool composite = false;
  std::vector<std::optional<ViewSpec>> components;
  std::vector<uint8_t> metadata;  // composite only
};

struct LayerSpec {
  int64_t forward_ns = 0;
  int64_t backward_ns = 0;
  std::vector<BufferSpec> buffers;
  std::vector<SaveSpec> saves;  // pushed in this order
};

struct WorkloadSpec {
  std::vector<LayerSpec> layers;
  uint64_t seed = 0;  // the bytes of every buffer derive from it

  // Bytes of layer `layer`'s non-persistent buffers (what its forward
  // allocates). REQUIRES: 0 <= layer < layers.size().
  int64_t ActivationBytes(int layer) const;
  // The sum over all layers.
  int64_t TotalActivationBytes() const;
};

// OK if the spec is well formed: at least one layer, durations >= 0,
// buffer indices in range, sizes >= 0, names non-empty, a plain save with
// exactly one present component, a composite with at least one.
// Errors: kInvalidArgument naming the layer and the save or buffer.
Status ValidateWorkloadSpec(const WorkloadSpec& spec);

// `layers` layers, each with `tensors_per_layer` contiguous bf16 tensors of
// bytes_per_layer / tensors_per_layer bytes each (rounded down to an even
// number, at least 2), each saved once. REQUIRES: arguments >= 1 (>= 0 for
// durations); returns an empty spec otherwise.
WorkloadSpec UniformWorkloadSpec(int layers, int64_t bytes_per_layer,
                                 int tensors_per_layer, int64_t forward_ns,
                                 int64_t backward_ns);

struct RandomSpecOptions {
  int layers = 4;
  // The Offloader's threshold: the large tensors get at least twice this
  // many elements, the small ones (scales, softmax statistics, masks) fewer.
  int64_t min_offload_elements = 4096;
  int64_t min_forward_ns = 100'000;
  int64_t max_forward_ns = 400'000;  // backward takes twice the forward
  // Add a sparse view (x[::8] along the outer dimension) of a large buffer,
  // which the engine makes contiguous or skips (SPEC §2.2).
  bool sparse_views = false;
};

// A transformer-like stack drawn from `seed` (same seed, same spec). Each
// layer saves: its input; q, k, v as interleaved views of one qkv buffer
// (sometimes the whole qkv buffer too); an attention output whose base is
// strided (the contiguous view, and sometimes the strided base itself); an
// MLP activation saved 1-3 times plus its transpose; a small softmax
// statistic; an FP8-style composite (data, transpose, a small scale, an
// optional absent component, metadata); a do-not-offload mask; a weight
// (TensorFlags::weight) and a parameter (TensorFlags::parameter), both
// persistent. Layer sizes and durations vary with the seed.
WorkloadSpec RandomWorkloadSpec(uint64_t seed,
                                const RandomSpecOptions& options);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_WORKLOAD_SPEC_H_
