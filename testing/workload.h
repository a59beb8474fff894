// A workload driver: runs a layer stack's forward and backward through an
// Offloader on any Backend, the way autograd drives TE's saved-tensor hooks,
// and checks every tensor that comes back from Pop.
//
//   WorkloadSpec spec = RandomWorkloadSpec(seed, RandomSpecOptions{...});
//   ASSERT_OK_AND_ASSIGN(auto offloader, Offloader::Create(backend, options));
//   ASSERT_OK_AND_ASSIGN(WorkloadResult result,
//                        RunWorkload(backend, *offloader, spec, hooks,
//                                    WorkloadOptions{.iterations = 3}));
//   EXPECT_THAT(result.mismatches, IsEmpty());
//
// One iteration:
//   for layer i = 0..n-1:  ForwardStep(); make the layer's buffers (fresh
//     bytes each iteration); forward compute writing them; Push each saved
//     tensor; then drop every Tensor the driver made, keeping only the
//     SavedTensor handles (as autograd does), so that releasing a group frees
//     its device memory.
//   for layer i = n-1..0:  BackwardStep(i); Pop each handle; backward compute
//     reading the popped tensors; check their dtype, shape, strides, name and
//     flags at once, and enqueue a capture of their bytes on the compute
//     stream; drop them.
//   FinishBackward(); synchronize the compute stream (the only host wait of
//   the iteration); compare the captured bytes with bytes computed on the
//   host from each buffer's seed.
//
// How the driver touches the device is injected (WorkloadHooks): compute,
// tensor creation and byte capture, so the same driver runs on the simulator
// (testing/sim_compute.h) and on a real GPU.

#ifndef OFFLOAD_TESTING_WORKLOAD_H_
#define OFFLOAD_TESTING_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// ---------------------------------------------------------------------------
// What a layer stack looks like.

// One step of a view recipe (testing/tensor_util.h's view helpers).
struct ViewOp {
  enum class Kind { kSlice, kSelect, kTranspose, kReshape };
  Kind kind = Kind::kSlice;
  int dim = 0;
  int dim2 = 0;                // Transpose: the other dimension
  int64_t start = 0;           // Slice start; Select index
  int64_t stop = 0;            // Slice
  int64_t step = 1;            // Slice
  std::vector<int64_t> shape;  // Reshape

  static ViewOp Slice(int dim, int64_t start, int64_t stop, int64_t step = 1);
  static ViewOp Select(int dim, int64_t index);
  static ViewOp Transpose(int d0, int d1);
  static ViewOp Reshape(std::vector<int64_t> shape);
};

// Applies `ops` in order to `tensor`; the result shares its storage.
// Errors: kInvalidArgument from the first op that does not fit.
StatusOr<Tensor> ApplyViewOps(const Tensor& tensor,
                              const std::vector<ViewOp>& ops);

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

// ---------------------------------------------------------------------------
// How the driver touches the device.

// One kernel of the model.
struct ComputeCall {
  std::string name;  // "forward L3", "backward L3"
  int64_t duration_ns = 0;
  std::vector<const Tensor*> reads;   // valid during the call only
  std::vector<const Tensor*> writes;  // valid during the call only
};

// Enqueues `call` on `stream` (the compute stream). Must not block.
using ComputeFn = std::function<Status(Stream& stream, const ComputeCall& call)>;

// Makes a contiguous device tensor whose storage byte i is
// PatternByte(i, seed), ready on the compute stream; MakeDeviceTensor's
// contract (testing/tensor_util.h).
using MakeTensorFn = std::function<StatusOr<Tensor>(
    Backend& backend, DType dtype, std::vector<int64_t> shape, uint64_t seed)>;

// Yields captured bytes once the compute stream has been synchronized.
using BytesFuture = std::function<StatusOr<std::vector<uint8_t>>()>;

// Enqueues on the compute stream a read of `tensor`'s logical bytes (as
// ReadTensorBytes returns them) without blocking the host.
using CaptureFn =
    std::function<StatusOr<BytesFuture>(Backend& backend, const Tensor& tensor)>;

// The default CaptureFn: copies the view's byte extent to pinned memory on
// the compute stream (this uses the D2H copy engine and compute-stream time)
// and gathers on the host when the future is called.
StatusOr<BytesFuture> CaptureByCopy(Backend& backend, const Tensor& tensor);

// Where the driver is in an iteration, for timelines.
enum class WorkloadPhase {
  kForwardBegin,       // before ForwardStep
  kBuffersMade,        // the layer's buffers were made
  kForwardComputed,    // its forward compute was enqueued
  kPushed,             // all its saves were pushed
  kBackwardBegin,      // before BackwardStep
  kPopped,             // all its saves were popped
  kBackwardComputed,   // its backward compute was enqueued
  kIterationEnd,       // after the synchronization and the checks
};

struct WorkloadEvent {
  WorkloadPhase phase;
  int iteration = 0;
  int layer = -1;  // -1 for kIterationEnd
};

struct WorkloadHooks {
  ComputeFn compute;         // required
  MakeTensorFn make_tensor;  // empty: MakeDeviceTensor
  CaptureFn capture;         // empty: CaptureByCopy
  // Device time in ns (e.g. SimBackend::NowNs), for iteration times.
  std::function<int64_t()> clock;
  // Called at each WorkloadPhase, on the host, synchronously.
  std::function<void(const WorkloadEvent&)> observer;
};

// ---------------------------------------------------------------------------
// Running it.

struct WorkloadOptions {
  int iterations = 1;
  // Capture and compare the bytes of every popped tensor.
  bool check_bytes = true;
  // The Offloader's min_offload_elements. When >= 0, tensors that must not
  // be offloaded (flagged, fewer elements, or of a layer the schedule does
  // not offload, SPEC §1.2/§4.4) must come back from Pop as the same view of
  // the same storage. -1: not checked.
  int64_t min_offload_elements = -1;
  // Accept a popped tensor whose strides are contiguous where the pushed
  // view's were not, as when the engine made a sparse view contiguous
  // (SPEC §2.2). Shape, dtype and bytes are still checked. Offloader::Pop
  // promises the pushed strides, so this is off by default.
  bool allow_made_contiguous = false;
  // For the checker's own tests: may change the expected bytes of a tensor
  // before the comparison.
  std::function<void(int iteration, int layer, const std::string& tensor,
                     std::vector<uint8_t>& expected)>
      tamper_expected;
};

// A popped tensor that differs from what was pushed.
struct Mismatch {
  int iteration = 0;
  int layer = 0;
  std::string tensor;  // the pushed tensor's name ("L2.qkv.k")
  std::string what;    // what differs

  // "iteration 0 layer 2 'L2.qkv.k': <what>".
  std::string ToString() const;
};

struct WorkloadResult {
  int iterations = 0;
  int64_t tensors_checked = 0;  // popped tensors (components) checked
  int64_t bytes_checked = 0;    // bytes compared
  int64_t tensors_kept = 0;     // popped as the very same view (not offloaded)
  std::vector<Mismatch> mismatches;
  // Device time of each iteration, from its start to the end of its
  // synchronization; empty without hooks.clock.
  std::vector<int64_t> iteration_ns;

  bool ok() const { return mismatches.empty(); }
};

// Drives `offloader` (made for spec.layers.size() model layers on `backend`)
// through options.iterations iterations of `spec`. Mismatches are returned
// in the result; errors are engine or backend calls that failed, with the
// iteration, layer and call in the message (then the compute stream is
// synchronized before pending captures are dropped).
// Errors: kInvalidArgument for an invalid spec, options or missing compute
//   hook; kInternal if ForwardStep returns an unexpected layer; whatever the
//   Offloader, the hooks or the backend return.
StatusOr<WorkloadResult> RunWorkload(Backend& backend, Offloader& offloader,
                                     const WorkloadSpec& spec,
                                     const WorkloadHooks& hooks,
                                     const WorkloadOptions& options);

}  // namespace offload

#endif  // OFFLOAD_TESTING_WORKLOAD_H_
