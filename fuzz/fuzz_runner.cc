#include "fuzz/fuzz_runner.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "testing/fault_backend.h"
#include "workload/tensor_util.h"

namespace offload::fuzz {
namespace {

using Kind = FuzzOp::Kind;

// What one pushed tensor must pop as.
struct Expected {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct Handle {
  SavedTensor saved;
  int generation = 0;      // which Offloader of the run made it
  uint64_t iteration = 0;  // its iteration, counted by the runner
  bool composite = false;
  std::vector<std::optional<Expected>> parts;  // one for a plain tensor
  std::vector<uint8_t> metadata;
  std::string name;
};

// What a failed call must leave unchanged (docs/api.md: "A failed call changes
// no state"): host bytes, statistics, group states.
std::vector<int64_t> Snapshot(const Offloader* o, int layers) {
  if (o == nullptr) return {};
  const OffloaderStats& s = o->stats();
  std::vector<int64_t> snapshot = {o->OffloadedBytes(), s.tensors_offloaded,
                                   s.tensors_kept,      s.spans_offloaded,
                                   s.bytes_offloaded,   s.bytes_reloaded,
                                   s.pinned_allocations};
  for (int layer = 0; layer < layers; ++layer) {
    snapshot.push_back(static_cast<int64_t>(o->state(layer)));
  }
  return snapshot;
}

std::unique_ptr<Backend> NewSim(uint64_t seed) {
  SimOptions options;
  options.seed = seed;
  options.record_trace = false;
  return NewSimBackend(options);
}

class Runner {
 public:
  Runner(const FuzzProgram& program, bool verbose)
      : backend_(NewSim(program.sim_seed)),
        sim_(dynamic_cast<SimBackend&>(backend_.inner())),
        verbose_(verbose) {
    for (int kind = 0; kind < kNumFaultKinds; ++kind) {
      Arm(kind, program.faults[kind][0], program.faults[kind][1]);
    }
  }

  std::optional<std::string> Run(const FuzzProgram& program) {
    for (size_t i = 0; i < program.ops.size() && !violation_; ++i) {
      where_ = "op " + std::to_string(i) + " " + program.ops[i].ToString();
      Step(program.ops[i]);
      if (!violation_ && !sim_.hazards().empty()) {
        Fail("hazard: " + sim_.hazards()[0].ToString());
      }
    }
    // Everything goes: the Offloader, then the caller's tensors.
    where_ = "after the last op";
    offloader_.reset();
    handles_.clear();
    base_.reset();
    sim_.RunUntilIdle();
    if (!violation_ && !sim_.hazards().empty()) {
      Fail("hazard: " + sim_.hazards()[0].ToString());
    }
    const int64_t device = sim_.device_memory().live_bytes;
    const int64_t pinned = sim_.pinned_memory().live_bytes;
    if (!violation_ && (device != 0 || pinned != 0)) {
      Fail("leak: " + std::to_string(device) + " device and " +
           std::to_string(pinned) + " pinned bytes live");
    }
    return violation_;
  }

 private:
  void Fail(const std::string& what) {
    if (!violation_) violation_ = where_ + ": " + what;
  }

  // True if OK; a violation unless a failure is a clear Status.
  bool Check(const Status& status, const char* call) {
    if (verbose_)
      std::fprintf(stderr, "  %s: %s\n", call, status.ToString().c_str());
    if (status.ok()) return true;
    const StatusCode code = status.code();
    if (status.message().empty() || (code != StatusCode::kInvalidArgument &&
                                     code != StatusCode::kFailedPrecondition &&
                                     code != StatusCode::kResourceExhausted &&
                                     code != StatusCode::kInternal)) {
      Fail(std::string(call) +
           " returned an unclear error: " + status.ToString());
    }
    // Argument and state errors change nothing (FinishBackward ends the
    // iteration whatever fails; Create has no state before).
    const std::string_view name = call;
    if ((code == StatusCode::kInvalidArgument ||
         code == StatusCode::kFailedPrecondition) &&
        name != "FinishBackward" && name != "Create" &&
        Snapshot(offloader_.get(), layers_) != before_ &&
        !RetainedShapeChange(status)) {
      Fail(std::string(call) + " failed (" + status.ToString() +
           ") but changed the Offloader's state");
    }
    return false;
  }

  // SPEC §3.5's documented exception (offload.h, ForwardStep and
  // StartOffload): saved tensors that changed shape under
  // retain_pinned_buffers are an error that keeps that one layer on device
  // and gives its retained buffers back — nothing else may change.
  bool RetainedShapeChange(const Status& status) const {
    if (status.code() != StatusCode::kInvalidArgument ||
        status.message().find("retain_pinned_buffers") ==
            std::string_view::npos) {
      return false;
    }
    const std::vector<int64_t> after = Snapshot(offloader_.get(), layers_);
    if (after.size() != before_.size() || after[0] > before_[0]) return false;
    constexpr size_t kStates = 7;  // Snapshot: 7 counters, then the states
    for (size_t i = 1; i < kStates; ++i) {
      if (after[i] != before_[i]) return false;
    }
    int kept = 0;
    for (size_t i = kStates; i < after.size(); ++i) {
      if (after[i] == before_[i]) continue;
      if (before_[i] != static_cast<int64_t>(GroupState::kNotOffloaded) ||
          after[i] != static_cast<int64_t>(GroupState::kKeptOnDevice)) {
        return false;
      }
      ++kept;
    }
    return kept == 1;
  }

  void Arm(int kind, int skip, int count) {
    using F = FaultInjectingBackend;
    static constexpr void (F::*kFail[kNumFaultKinds])(int, int) = {
        &F::FailPinnedAllocations,
        &F::FailDeviceAllocations,
        &F::FailCopies,
        &F::FailNewStreams,
        &F::FailNewEvents,
        &F::FailRecords,
        &F::FailWaits};
    (backend_.*kFail[kind])(skip, count);
  }

  void Step(const FuzzOp& op) {
    if (verbose_) std::fprintf(stderr, "%s\n", where_.c_str());
    if (op.kind == Kind::kCreate) return Create(op);
    if (op.kind == Kind::kArmFault) return Arm(op.arg, op.skip, op.count);
    if (op.kind == Kind::kRunFor) return sim_.RunFor(int64_t{op.arg} * 1000);
    if (offloader_ == nullptr) return;
    before_ = Snapshot(offloader_.get(), layers_);
    Offloader& o = *offloader_;
    switch (op.kind) {
      case Kind::kDestroy:
        return offloader_.reset();
      case Kind::kForwardStep:
        return (void)Check(o.ForwardStep().status(), "ForwardStep");
      case Kind::kBackwardStep:
        backward_ |= Check(o.BackwardStep(op.arg), "BackwardStep");
        return;
      case Kind::kFinishBackward:
        // The iteration ends, whatever fails, iff a backward step was taken.
        (void)Check(o.FinishBackward(), "FinishBackward");
        iteration_ += backward_ ? 1 : 0;
        backward_ = false;
        return;
      case Kind::kPush:
      case Kind::kPushComposite:
        return Push(op);
      case Kind::kPop:
      case Kind::kPopComposite:
        return Pop(op);
      case Kind::kStartOffload:
        return (void)Check(o.StartOffload(op.arg), "StartOffload");
      case Kind::kReleaseForwardMemory:
        return (void)Check(o.ReleaseForwardMemory(op.arg),
                           "ReleaseForwardMemory");
      case Kind::kStartReload:
        return (void)Check(o.StartReload(op.arg), "StartReload");
      default:
        return;
    }
  }

  void Create(const FuzzOp& op) {
    offloader_.reset();
    OffloadOptions options = op.options;
    if (op.offload_stream) {
      StatusOr<Stream*> stream = backend_.NewStream("fuzz_offload");
      if (!stream.ok()) return;  // injected
      options.offload_stream = *stream;
    }
    StatusOr<std::unique_ptr<Offloader>> made =
        Offloader::Create(backend_, options);
    if (!Check(made.status(), "Create")) return;
    offloader_ = std::move(made).value();
    enabled_ = options.enabled;
    layers_ = options.model_layers;
    ++generation_;
    iteration_ = 0;
    backward_ = false;
  }

  // The tensor `spec` asks for and its expected pop; nullopt when making it
  // failed (an injected fault).
  std::optional<std::pair<Tensor, Expected>> MakeTensor(
      const TensorSpec& spec) {
    const bool on_base = spec.kind == TensorKind::kRowSlice ||
                         spec.kind == TensorKind::kSame ||
                         spec.kind == TensorKind::kBaseSparse;
    Tensor t;
    uint64_t seed = base_seed_;
    if (on_base && base_) {
      t = *base_;
    } else {
      seed = next_seed_++;
      std::vector<int64_t> shape = {spec.rows, spec.cols};
      if (spec.kind == TensorKind::kSmall) shape = {1, 1 + spec.cols % 4};
      StatusOr<Tensor> made =
          MakeDeviceTensor(backend_, spec.dtype, shape, seed);
      if (!made.ok()) return std::nullopt;
      t = std::move(made).value();
      if (spec.hold) base_ = t, base_seed_ = seed;
    }
    const int64_t rows = t.shape[0];
    StatusOr<Tensor> view = t;
    switch (spec.kind) {
      case TensorKind::kSparse:
        view = Slice(t, 0, 0, rows, 2 + spec.extra % 7);
        break;
      case TensorKind::kRowSlice:
        view = Slice(t, 0, spec.extra % rows, rows);
        break;
      case TensorKind::kTranspose:
        view = Transpose(t, 0, 1);
        break;
      case TensorKind::kBaseSparse:
        view = Slice(t, 0, rows > 1 ? 1 : 0, rows, 2);
        if (view.ok()) view->flags.offload_base = true;
        break;
      default:
        break;
    }
    if (!view.ok()) {
      Fail("view: " + view.status().ToString());
      return std::nullopt;
    }
    if (spec.kind == TensorKind::kFlagged) view->flags = spec.flags;
    if (spec.ready_event) {  // TE's start_offload; only if really recorded
      StatusOr<std::unique_ptr<Event>> event = backend_.NewEvent();
      if (event.ok() && backend_.ComputeStream().Record(**event).ok()) {
        view->ready = std::shared_ptr<Event>(std::move(event).value());
      }
    }
    Expected expected{view->dtype, view->shape,
                      PatternTensorBytes(*view, seed)};
    return std::pair{std::move(view).value(), std::move(expected)};
  }

  void Push(const FuzzOp& op) {
    Handle handle{{},
                  generation_,
                  iteration_,
                  op.kind == Kind::kPushComposite,
                  {},
                  op.metadata,
                  "c" + std::to_string(next_seed_)};
    CompositeTensor composite{{}, op.metadata, handle.name};
    size_t next = 0;
    for (size_t i = 0; i < std::max<size_t>(op.present.size(), 1); ++i) {
      if (handle.composite && !op.present[i]) {
        composite.components.emplace_back();
        handle.parts.emplace_back();
        continue;
      }
      auto made = MakeTensor(op.tensors[next++]);
      if (!made) return;
      composite.components.emplace_back(std::move(made->first));
      handle.parts.emplace_back(std::move(made->second));
    }
    StatusOr<SavedTensor> saved =
        handle.composite ? offloader_->Push(composite)
                         : offloader_->Push(*composite.components[0]);
    if (!Check(saved.status(), "Push")) return;
    handle.saved = std::move(saved).value();
    if (handles_.size() < 512) handles_.push_back(std::move(handle));
  }

  // Pops the handle `op.arg` back from the newest (one past the oldest: an
  // empty handle) and checks what comes back.
  void Pop(const FuzzOp& op) {
    const size_t back = op.arg % (handles_.size() + 1);
    const Handle* h = back < handles_.size()
                          ? &handles_[handles_.size() - 1 - back]
                          : nullptr;
    const SavedTensor empty;
    const SavedTensor& saved = h ? h->saved : empty;
    CompositeTensor got;
    if (op.kind == Kind::kPopComposite) {
      StatusOr<CompositeTensor> popped = offloader_->PopComposite(saved);
      if (!Check(popped.status(), "PopComposite")) return;
      got = std::move(popped).value();
    } else {
      StatusOr<Tensor> popped = offloader_->Pop(saved);
      if (!Check(popped.status(), "Pop")) return;
      got.components.emplace_back(std::move(popped).value());
    }
    if (h == nullptr) return Fail("an empty handle popped");
    if (h->generation != generation_)
      return Fail("a handle of a destroyed Offloader popped");
    if (enabled_ && h->iteration != iteration_) {
      return Fail("a handle of iteration " + std::to_string(h->iteration) +
                  " popped in iteration " + std::to_string(iteration_));
    }
    if (h->composite != (op.kind == Kind::kPopComposite)) {
      return Fail("a composite/plain handle popped by the other call");
    }
    if (h->composite && (got.name != h->name || got.metadata != h->metadata)) {
      return Fail("composite name or metadata changed");
    }
    if (got.components.size() != h->parts.size())
      return Fail("component count changed");
    for (size_t i = 0; i < h->parts.size(); ++i) {
      const std::string part = "component " + std::to_string(i) + ": ";
      if (got.components[i].has_value() != h->parts[i].has_value()) {
        return Fail(part + "presence changed");
      }
      if (!h->parts[i]) continue;
      Tensor t = *got.components[i];
      if (t.dtype != h->parts[i]->dtype || t.shape != h->parts[i]->shape) {
        return Fail(part + "dtype or shape changed: " + t.Describe());
      }
      // Pop ordered the compute stream after the reload; every ready point
      // of this harness is on the compute stream. Read through the
      // simulator itself so that no fault hits the check.
      t.ready = nullptr;
      StatusOr<std::vector<uint8_t>> bytes = ReadTensorBytes(sim_, t);
      if (!bytes.ok())
        return Fail(part + "unreadable: " + bytes.status().ToString());
      if (*bytes != h->parts[i]->bytes)
        return Fail(part + "wrong bytes in " + t.Describe());
    }
  }

  FaultInjectingBackend backend_;  // first: outlives every member below
  SimBackend& sim_;
  const bool verbose_;
  std::unique_ptr<Offloader> offloader_;
  bool enabled_ = true;
  int layers_ = 0;
  std::vector<int64_t> before_;  // Snapshot before the current call
  int generation_ = 0;
  uint64_t iteration_ = 0;
  bool backward_ = false;       // a BackwardStep succeeded in this iteration
  std::optional<Tensor> base_;  // held by the caller; later views share it
  uint64_t base_seed_ = 0;
  uint64_t next_seed_ = 1;
  std::vector<Handle> handles_;
  std::string where_;
  std::optional<std::string> violation_;
};

}  // namespace

std::optional<std::string> RunProgram(const FuzzProgram& program,
                                      bool verbose) {
  return Runner(program, verbose).Run(program);
}

}  // namespace offload::fuzz
