// libFuzzer target for the fine-grained front door (PipelineOffloader, SPEC
// §5): any bytes are a fault plan, options and a sequence of calls — chunk
// and group starts and commits (with release tensors), pushes, backward
// starts and ends, pops of any handle, iteration ends, delayed-offload
// issues, armed faults, passing time and re-creation — run on a SimBackend
// behind a FaultInjectingBackend. Checked after every call:
//  - an error is a clear Status (non-empty message; invalid argument,
//    failed precondition, resource exhausted or internal), and an argument
//    or state error changes nothing (stats, host bytes);
//  - a popped tensor has the dtype, shape and bytes it was pushed with;
//  - the simulator reports no hazard;
// and at the end, once the offloader and every tensor are gone, no device
// or pinned bytes are live. Decoding is total: a missing byte reads as 0.
// OFFLOAD_FUZZ_VERBOSE=1 prints each call and its status.
//
// Input: sim seed; 7 x (skip, count % 4) faults; an options byte (bits 0-2:
// names a, b, c offloaded; 3-5: fraction 0, .25, .5, .8, 1; 6: delayed
// offloads; 7: no pinned pool); a byte (vpp = 1 + (b & 3) % 3; with bit 7 a cap
// on "a" of (b >> 2) % 3); then ops: a kind byte (% 12) and its argument
// bytes. Handles of earlier iterations and offloaders stay poppable (to be
// refused).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "testing/fault_backend.h"
#include "workload/pattern_bytes.h"
#include "workload/tensor_util.h"

namespace offload::fuzz {
namespace {

class Bytes {
 public:
  explicit Bytes(std::span<const uint8_t> data) : data_(data) {}
  int Next() { return pos_ < data_.size() ? data_[pos_++] : 0; }
  bool done() const { return pos_ >= data_.size(); }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

const char* kNames[] = {"a", "b", "c", ""};

struct Handle {
  SavedTensor saved;
  std::vector<int64_t> shape;
  uint64_t seed = 0;
};

class Runner {
 public:
  explicit Runner(Bytes& in, bool verbose) : in_(in), verbose_(verbose) {
    SimOptions sim_options;
    sim_options.seed = in_.Next();
    sim_options.record_trace = false;
    sim_options.d2h_gbps = sim_options.h2d_gbps = 1.0;
    backend_ = std::make_unique<FaultInjectingBackend>(
        NewSimBackend(sim_options));
    sim_ = &dynamic_cast<SimBackend&>(backend_->inner());
    for (int kind = 0; kind < 7; ++kind) {
      const int skip = in_.Next();
      Arm(kind, skip, in_.Next() % 4);
    }
    const int flags = in_.Next();
    for (int i = 0; i < 3; ++i) {
      if (flags & (1 << i)) options_.offload_modules.push_back(kNames[i]);
    }
    const double fractions[] = {0, 0.25, 0.5, 0.8, 1.0, 1.0, 1.0, 1.0};
    options_.activation_offload_fraction = fractions[(flags >> 3) & 7];
    options_.delay_offload = flags & 64;
    options_.pinned_pool = !(flags & 128);
    options_.min_offload_elements = 64;
    const int shape = in_.Next();
    options_.virtual_stages = 1 + (shape & 3) % 3;
    if (shape & 0x80) options_.max_inflight["a"] = (shape >> 2) % 3;
    Create();
  }

  std::optional<std::string> Run() {
    for (int i = 0; i < 256 && !in_.done() && !violation_; ++i) {
      Step(i);
      if (!violation_ && !sim_->hazards().empty()) {
        Fail("hazard: " + sim_->hazards()[0].ToString());
      }
    }
    where_ = "after the last op";
    off_.reset();
    handles_.clear();
    held_.clear();
    sim_->RunUntilIdle();
    if (!violation_ && !sim_->hazards().empty()) {
      Fail("hazard: " + sim_->hazards()[0].ToString());
    }
    if (!violation_ && (sim_->device_memory().live_bytes != 0 ||
                        sim_->pinned_memory().live_bytes != 0)) {
      Fail("leak: " + std::to_string(sim_->device_memory().live_bytes) +
           " device and " + std::to_string(sim_->pinned_memory().live_bytes) +
           " pinned bytes live");
    }
    return violation_;
  }

 private:
  void Arm(int kind, int skip, int count) {
    using F = FaultInjectingBackend;
    static constexpr void (F::*kFail[7])(int, int) = {
        &F::FailPinnedAllocations, &F::FailDeviceAllocations, &F::FailCopies,
        &F::FailNewStreams,        &F::FailNewEvents,         &F::FailRecords,
        &F::FailWaits};
    (backend_.get()->*kFail[kind % 7])(skip, count);
  }
  void Fail(const std::string& what) {
    if (!violation_) violation_ = where_ + ": " + what;
  }
  std::vector<int64_t> Snapshot() const {
    if (off_ == nullptr) return {};
    const OffloaderStats& s = off_->stats();
    return {off_->OffloadedBytes(), s.tensors_offloaded, s.tensors_kept,
            s.spans_offloaded, s.bytes_offloaded, s.bytes_reloaded};
  }
  // True if OK; a violation unless a failure is a clear Status that, for
  // argument and state errors, changed nothing.
  bool Check(const Status& status, const std::vector<int64_t>& before) {
    if (verbose_) std::fprintf(stderr, "  -> %s\n", status.ToString().c_str());
    if (status.ok()) return true;
    const StatusCode code = status.code();
    if (status.message().empty() || (code != StatusCode::kInvalidArgument &&
                                     code != StatusCode::kFailedPrecondition &&
                                     code != StatusCode::kResourceExhausted &&
                                     code != StatusCode::kInternal)) {
      Fail("unclear error " + status.ToString());
    } else if ((code == StatusCode::kInvalidArgument ||
                code == StatusCode::kFailedPrecondition) &&
               Snapshot() != before) {
      Fail("a failed call changed state: " + status.ToString());
    }
    return false;
  }
  void Create() {
    off_.reset();
    StatusOr<std::unique_ptr<PipelineOffloader>> made =
        PipelineOffloader::Create(*backend_, options_);
    if (Check(made.status(), {})) off_ = std::move(made).value();
  }

  void Step(int index) {
    const int kind = in_.Next() % 12;
    where_ = "op " + std::to_string(index) + " kind " + std::to_string(kind);
    if (verbose_) std::fprintf(stderr, "%s\n", where_.c_str());
    if (kind == 10) {
      const int fault = in_.Next();
      const int skip = in_.Next();
      return Arm(fault, skip, in_.Next() % 4);
    }
    if (kind == 11) {
      const int b = in_.Next();
      if (b & 0x80) return Create();
      return sim_->RunFor(int64_t{b} * 10'000);
    }
    if (off_ == nullptr) return;
    PipelineOffloader& o = *off_;
    const std::vector<int64_t> before = Snapshot();
    const int vpp = options_.virtual_stages;
    switch (kind) {
      case 0: {
        const int stage = in_.Next() % (vpp + 1);
        (void)Check(o.StartChunk(stage, in_.Next() % 5), before);
        return;
      }
      case 1:
        (void)Check(o.GroupStart(kNames[in_.Next() % 4]), before);
        return;
      case 2:
        return Push(before);
      case 3: {
        const int b = in_.Next();
        std::vector<Tensor> release;
        if ((b & 4) && !held_.empty()) release.push_back(held_.back());
        if (b & 8) held_.clear();  // the caller drops what it held
        (void)Check(o.GroupCommit(kNames[b % 4], release), before);
        return;
      }
      case 4: {
        const int stage = in_.Next() % (vpp + 1);
        (void)Check(o.StartChunkBackward(stage, in_.Next() % 5), before);
        return;
      }
      case 5:
        (void)Check(o.GroupBackwardStart(kNames[in_.Next() % 4]), before);
        return;
      case 6:
        return Pop(before);
      case 7:
        (void)Check(o.GroupBackwardEnd(kNames[in_.Next() % 4]), before);
        return;
      case 8:
        (void)Check(o.FinishIteration(), before);
        return;
      case 9:
        (void)Check(o.IssueDelayedOffloads(), before);
        return;
    }
  }

  void Push(const std::vector<int64_t>& before) {
    const int b = in_.Next();
    const std::vector<int64_t> shape = {1 + b % 32, 16};
    const uint64_t seed = ++seed_;
    StatusOr<Tensor> made =
        MakeDeviceTensor(*backend_, DType::kF32, shape, seed);
    if (!made.ok()) return;  // an injected allocation failure
    StatusOr<SavedTensor> saved = off_->Push(*made);
    if (!Check(saved.status(), before)) return;
    handles_.push_back(Handle{*saved, shape, seed});
    if (b & 0x80) held_.push_back(*made);  // the caller keeps it
  }

  void Pop(const std::vector<int64_t>& before) {
    const int back = in_.Next();
    if (handles_.empty()) return;
    const Handle& h = handles_[handles_.size() - 1 - back % handles_.size()];
    StatusOr<Tensor> popped = off_->Pop(h.saved);
    if (!Check(popped.status(), before)) return;
    if (popped->dtype != DType::kF32 || popped->shape != h.shape) {
      return Fail("popped tensor has another dtype or shape: " +
                  popped->Describe());
    }
    StatusOr<std::vector<uint8_t>> bytes = ReadTensorBytes(*sim_, *popped);
    if (!bytes.ok()) return Fail("reading popped bytes: " +
                                 bytes.status().ToString());
    if (*bytes != PatternBytes(0, h.shape[0] * h.shape[1] * 4, h.seed)) {
      Fail("popped bytes differ from what was pushed");
    }
  }

  Bytes& in_;
  const bool verbose_;
  std::unique_ptr<FaultInjectingBackend> backend_;
  SimBackend* sim_ = nullptr;
  PipelineOffloadOptions options_;
  std::unique_ptr<PipelineOffloader> off_;
  std::vector<Handle> handles_;
  std::vector<Tensor> held_;
  uint64_t seed_ = 0;
  std::string where_;
  std::optional<std::string> violation_;
};

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("OFFLOAD_FUZZ_VERBOSE") != nullptr;
  offload::fuzz::Bytes in(std::span<const uint8_t>(data, size));
  offload::fuzz::Runner runner(in, verbose);
  std::optional<std::string> violation = runner.Run();
  if (violation.has_value()) {
    std::fprintf(stderr, "pipeline_fuzz: VIOLATION at %s\n",
                 violation->c_str());
    std::abort();
  }
  return 0;
}
