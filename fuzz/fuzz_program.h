// The offload fuzz target's input format: any bytes decode to a FuzzProgram,
// a fault plan plus a sequence of Offloader API calls (deterministic and
// total: a missing byte reads as 0, every value is mapped into range).
//
//   header  sim_seed, then 7 x (skip, count) for the fault kinds in
//           FaultKind order; count = byte % 4 (0: off)
//   op      kind byte (% kNumKinds) and its arguments:
//     Create            flags (1 manual, 2 retain_pinned_buffers,
//                       4 skip_sparse_views, 8 schedule table, 16 an
//                       offload_stream, 0xE0 all set: disabled), layers
//                       (1 + b % 8), offloaded (b % 10 - 1), min elements
//                       (index), coverage (index); with a table: a layer
//                       mask (bit 7 clear: only real layers) and per key
//                       (release, reload) bytes, made valid unless the
//                       reload byte's bit 7 is set
//     BackwardStep, StartOffload, ReleaseForwardMemory, StartReload
//                       layer byte: < 0xF0: b % (layers + 1) (the last is
//                       out of range), else a far-out value
//     Push              one TensorSpec
//     PushComposite     byte: 1 + (b & 3) % 3 components, present mask b>>2 &
//     7,
//                       metadata length b >> 5; metadata; a TensorSpec per
//                       present component
//     Pop, PopComposite byte: the handle that many back from the newest
//                       (one past the oldest: an empty handle)
//     ArmFault          kind, skip, count (% 4) bytes
//     RunFor            byte: the host spends b microseconds
//   TensorSpec   kind byte (low 3 bits: TensorKind; 8 hold as the base of
//                later views; 16 a ready event; 32/64/128 parameter, weight,
//                do_not_offload for kFlagged), rows (1 + b % 64), cols
//                (1 + b % 64), dtype byte (low 3 bits; the rest is `extra`).

#ifndef OFFLOAD_FUZZ_FUZZ_PROGRAM_H_
#define OFFLOAD_FUZZ_FUZZ_PROGRAM_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/offload_options.h"
#include "engine/tensor.h"

namespace offload::fuzz {

enum class FaultKind {
  kPinned,
  kDevice,
  kCopy,
  kNewStream,
  kNewEvent,
  kRecord,
  kWait
};
inline constexpr int kNumFaultKinds = 7;

enum class TensorKind {
  kContiguous,  // a fresh tensor
  kSparse,      // x[::step] of a fresh tensor (made contiguous or skipped)
  kRowSlice,    // x[start:] of the held base (or a fresh tensor)
  kTranspose,   // a fresh tensor's transpose
  kSmall,       // a fresh tensor of a few elements
  kFlagged,     // a fresh tensor flagged parameter/weight/do_not_offload
  kSame,        // the held base itself again
  kBaseSparse,  // x[1::2] of the held base, flagged offload_base
};

struct TensorSpec {
  TensorKind kind = TensorKind::kContiguous;
  bool hold = false;
  bool ready_event = false;
  TensorFlags flags;
  int64_t rows = 1, cols = 1;
  DType dtype = DType::kF32;
  int extra = 0;
};

struct FuzzOp {
  enum class Kind {
    kCreate,
    kDestroy,
    kForwardStep,
    kBackwardStep,
    kFinishBackward,
    kPush,
    kPushComposite,
    kPop,
    kPopComposite,
    kStartOffload,
    kReleaseForwardMemory,
    kStartReload,
    kArmFault,
    kRunFor,
  };
  static constexpr int kNumKinds = 14;

  Kind kind = Kind::kDestroy;
  int arg = 0;  // layer, handle back-index, fault kind, or microseconds
  int skip = 0, count = 0;          // kArmFault
  OffloadOptions options;           // kCreate
  bool offload_stream = false;      // kCreate: make one for options
  std::vector<TensorSpec> tensors;  // kPush: one; kPushComposite: present
  std::vector<bool> present;        // kPushComposite: per component
  std::vector<uint8_t> metadata;    // kPushComposite

  std::string ToString() const;
};

struct FuzzProgram {
  uint64_t sim_seed = 0;
  std::array<std::array<int, 2>, kNumFaultKinds> faults{};  // skip, count
  std::vector<FuzzOp> ops;
};

inline constexpr int kMaxOps = 256;

FuzzProgram DecodeProgram(std::span<const uint8_t> data);

}  // namespace offload::fuzz

#endif  // OFFLOAD_FUZZ_FUZZ_PROGRAM_H_
