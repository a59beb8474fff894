// A model-based test of the Offloader's public API (rc::state): random
// sequences of valid and invalid calls in manual mode. A model predicts, for
// each call, whether it succeeds and which error code it returns otherwise,
// and each layer's group state afterwards. Invalid calls must change nothing
// observable: group states, statistics, host bytes and the simulator's trace
// (no device work enqueued). Valid pops must give back the pushed bytes.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "rapidcheck/state.h"
#include "testing/byte_pattern.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

constexpr int kLayers = 4;
constexpr int64_t kMinElements = 64;

struct Handle {
  int layer = -1;        // pushed in
  uint64_t iteration = 0;
  bool kept = false;     // small: never offloaded
  uint64_t seed = 0;
  std::vector<int64_t> shape;
};

struct Model {
  uint64_t iteration = 1;
  int forward_count = 0;
  int backward_count = 0;
  int open_layer = -1;
  int last_backward = -1;
  std::vector<bool> backward_begun = std::vector<bool>(kLayers, false);
  std::vector<GroupState> states =
      std::vector<GroupState>(kLayers, GroupState::kNotOffloaded);
  std::vector<Handle> handles;
};

struct Sut {
  std::unique_ptr<SimBackend> sim = NewSimBackend(SimOptions{});
  std::unique_ptr<Offloader> offloader;
  std::vector<SavedTensor> handles;

  Sut() {
    OffloadOptions options;
    options.model_layers = kLayers;
    options.manual_synchronization = true;
    options.min_offload_elements = kMinElements;
    offloader = std::move(Offloader::Create(*sim, options)).value();
  }
  ~Sut() { offloader.reset(); }
};

// What an invalid call must not change.
struct Snapshot {
  std::vector<GroupState> states;
  int64_t offloaded_bytes;
  int64_t tensors_offloaded, tensors_kept, spans, pinned_allocations;
  size_t trace_size;

  static Snapshot Of(const Sut& sut) {
    Snapshot s;
    for (int l = 0; l < kLayers; ++l) s.states.push_back(sut.offloader->state(l));
    const OffloaderStats& stats = sut.offloader->stats();
    s.offloaded_bytes = sut.offloader->OffloadedBytes();
    s.tensors_offloaded = stats.tensors_offloaded;
    s.tensors_kept = stats.tensors_kept;
    s.spans = stats.spans_offloaded;
    s.pinned_allocations = stats.pinned_allocations;
    s.trace_size = sut.sim->trace().size();
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

using Command = rc::state::Command<Model, Sut>;

// Runs `call`; if the model says `expected` is an error code, checks it and
// that nothing changed; otherwise checks success and the model's states.
template <typename Call>
void Check(const Model& after, Sut& sut, std::optional<StatusCode> expected,
           Call call) {
  Snapshot before = Snapshot::Of(sut);
  Status status = call();
  if (expected.has_value()) {
    RC_ASSERT(status.code() == *expected);
    RC_ASSERT(!status.message().empty());
    RC_ASSERT(Snapshot::Of(sut) == before);
    return;
  }
  if (!status.ok()) RC_FAIL("unexpected error: " + status.ToString());
  for (int l = 0; l < kLayers; ++l) {
    RC_ASSERT(sut.offloader->state(l) == after.states[l]);
  }
}

struct ForwardStep : Command {
  std::optional<StatusCode> Error(const Model& m) const {
    if (m.backward_count > 0 || m.forward_count == kLayers) {
      return StatusCode::kFailedPrecondition;
    }
    return std::nullopt;
  }
  void apply(Model& m) const override {
    if (Error(m)) return;
    m.open_layer = m.forward_count++;
  }
  void run(const Model& m, Sut& sut) const override {
    Model after = m;
    apply(after);
    Check(after, sut, Error(m), [&] {
      StatusOr<int> layer = sut.offloader->ForwardStep();
      if (layer.ok() && *layer != m.forward_count) {
        return InternalError("wrong layer " + std::to_string(*layer));
      }
      return layer.status();
    });
  }
  void show(std::ostream& os) const override { os << "ForwardStep()"; }
};

struct BackwardStep : Command {
  int layer = *rc::gen::inRange(-1, kLayers + 1);
  std::optional<StatusCode> Error(const Model& m) const {
    if (layer < 0 || layer >= kLayers) return StatusCode::kInvalidArgument;
    if (layer >= m.forward_count || m.backward_begun[layer]) {
      return StatusCode::kFailedPrecondition;
    }
    return std::nullopt;
  }
  void apply(Model& m) const override {
    if (Error(m)) return;
    m.open_layer = -1;
    if (m.last_backward >= 0) m.states[m.last_backward] = GroupState::kReleased;
    m.backward_begun[layer] = true;
    m.backward_count++;
    m.last_backward = layer;
  }
  void run(const Model& m, Sut& sut) const override {
    Model after = m;
    apply(after);
    Check(after, sut, Error(m), [&] { return sut.offloader->BackwardStep(layer); });
  }
  void show(std::ostream& os) const override {
    os << "BackwardStep(" << layer << ")";
  }
};

struct FinishBackward : Command {
  std::optional<StatusCode> Error(const Model& m) const {
    if (m.backward_count == 0) return StatusCode::kFailedPrecondition;
    return std::nullopt;
  }
  void apply(Model& m) const override {
    if (Error(m)) return;
    Model next;
    next.iteration = m.iteration + 1;
    next.handles = m.handles;
    m = next;
  }
  void run(const Model& m, Sut& sut) const override {
    Model after = m;
    apply(after);
    Check(after, sut, Error(m), [&] { return sut.offloader->FinishBackward(); });
  }
  void show(std::ostream& os) const override { os << "FinishBackward()"; }
};

struct Push : Command {
  bool small = *rc::gen::arbitrary<bool>();
  uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1000);
  std::vector<int64_t> Shape() const {
    return small ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{16, 8};
  }
  std::optional<StatusCode> Error(const Model& m) const {
    if (m.open_layer < 0) return StatusCode::kFailedPrecondition;
    return std::nullopt;
  }
  void apply(Model& m) const override {
    if (Error(m)) return;
    m.handles.push_back(Handle{m.open_layer, m.iteration, small, seed, Shape()});
  }
  void run(const Model& m, Sut& sut) const override {
    Model after = m;
    apply(after);
    StatusOr<Tensor> tensor =
        MakeDeviceTensor(*sut.sim, DType::kF32, Shape(), seed);
    RC_ASSERT(tensor.ok());
    Check(after, sut, Error(m), [&] {
      StatusOr<SavedTensor> saved = sut.offloader->Push(*tensor);
      if (saved.ok()) sut.handles.push_back(*saved);
      return saved.status();
    });
  }
  void show(std::ostream& os) const override {
    os << "Push(" << (small ? "small" : "large") << ", seed " << seed << ")";
  }
};

struct Pop : Command {
  int index;
  explicit Pop(const Model& m) {
    RC_PRE(!m.handles.empty());
    index = *rc::gen::inRange<int>(0, m.handles.size());
  }
  std::optional<StatusCode> Error(const Model& m) const {
    const Handle& h = m.handles[index];
    if (h.iteration != m.iteration) return StatusCode::kInvalidArgument;
    if (h.kept) return std::nullopt;
    GroupState state = m.states[h.layer];
    if (state == GroupState::kReleased || state == GroupState::kOffloadFinished) {
      return StatusCode::kFailedPrecondition;
    }
    return std::nullopt;
  }
  void apply(Model&) const override {}
  void run(const Model& m, Sut& sut) const override {
    std::optional<Tensor> popped;
    Check(m, sut, Error(m), [&] {
      StatusOr<Tensor> tensor = sut.offloader->Pop(sut.handles[index]);
      if (tensor.ok()) popped = *tensor;
      return tensor.status();
    });
    if (popped.has_value()) {
      const Handle& h = m.handles[index];
      StatusOr<std::vector<uint8_t>> bytes = ReadTensorBytes(*sut.sim, *popped);
      RC_ASSERT(bytes.ok());
      RC_ASSERT(popped->shape == h.shape);
      // Pushed: a whole storage from MakeDeviceTensor, so its bytes are the
      // pattern from storage byte 0.
      RC_ASSERT(*bytes == PatternBytes(0, popped->nbytes(), h.seed));
      RC_ASSERT(sut.sim->hazards().empty());
    }
  }
  void show(std::ostream& os) const override { os << "Pop(#" << index << ")"; }
};

// StartOffload, ReleaseForwardMemory, StartReload: each moves one state on.
template <GroupState kFrom, GroupState kTo, int kWhich>
struct Manual : Command {
  int layer = *rc::gen::inRange(-1, kLayers + 1);
  std::optional<StatusCode> Error(const Model& m) const {
    if (layer < 0 || layer >= kLayers) return StatusCode::kInvalidArgument;
    if (layer >= m.forward_count || m.states[layer] != kFrom) {
      return StatusCode::kFailedPrecondition;
    }
    // A layer whose backward began cannot start an offload any more.
    if (kWhich == 0 && m.backward_begun[layer]) {
      return StatusCode::kFailedPrecondition;
    }
    return std::nullopt;
  }
  void apply(Model& m) const override {
    if (Error(m)) return;
    m.states[layer] = kTo;
    if (kWhich == 0 && m.open_layer == layer) m.open_layer = -1;
  }
  void run(const Model& m, Sut& sut) const override {
    Model after = m;
    apply(after);
    Check(after, sut, Error(m), [&] {
      Offloader& o = *sut.offloader;
      return kWhich == 0   ? o.StartOffload(layer)
             : kWhich == 1 ? o.ReleaseForwardMemory(layer)
                           : o.StartReload(layer);
    });
  }
  void show(std::ostream& os) const override {
    const char* names[] = {"StartOffload", "ReleaseForwardMemory",
                           "StartReload"};
    os << names[kWhich] << "(" << layer << ")";
  }
};
using StartOffload =
    Manual<GroupState::kNotOffloaded, GroupState::kOffloadStarted, 0>;
using ReleaseForwardMemory =
    Manual<GroupState::kOffloadStarted, GroupState::kOffloadFinished, 1>;
using StartReload =
    Manual<GroupState::kOffloadFinished, GroupState::kReloadStarted, 2>;

RC_GTEST_PROP(OffloaderModel, ValidAndInvalidCallsMatchTheModel, ()) {
  Model model;
  Sut sut;
  rc::state::check(
      model, sut,
      rc::state::gen::execOneOfWithArgs<ForwardStep, BackwardStep,
                                        FinishBackward, Push, Push, Pop,
                                        StartOffload, ReleaseForwardMemory,
                                        StartReload>());
  sut.sim->RunUntilIdle();
  RC_ASSERT(sut.sim->hazards().empty());
}

}  // namespace
}  // namespace offload
