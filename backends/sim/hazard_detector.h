// Finds stream-ordering bugs in the simulator's memory accesses.
//
// The detector sees every allocation, access and free in host (enqueue) order,
// each with the vector clock of the operation doing it. Two accesses of
// overlapping bytes conflict when at least one writes; a conflict is a hazard
// unless the earlier access happens before the later one. Because every
// dependency of a stream operation is fixed when it is enqueued, checking in
// enqueue order finds every hazard whatever the timing turns out to be.
//
// Hazards are recorded (never fatal) with both operations involved, so a test
// can assert on exactly which bug a program has.

#ifndef OFFLOAD_BACKENDS_SIM_HAZARD_DETECTOR_H_
#define OFFLOAD_BACKENDS_SIM_HAZARD_DETECTOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/sim/vector_clock.h"

namespace offload {

enum class HazardKind {
  // A read not ordered after an overlapping write: it may see old bytes.
  kReadBeforeWrite,
  // A write not ordered after an overlapping read: the reader may see the
  // new bytes (e.g. a buffer reused while a copy still reads it).
  kWriteDuringRead,
  // Two overlapping writes with no order between them.
  kWriteAfterWrite,
  // A free not ordered after an access: stream-ordered use-after-free.
  kFreeDuringUse,
  // An access of memory already freed (in host order).
  kUseAfterFree,
  // An access not ordered after the stream-ordered allocation of its memory.
  kUseBeforeAllocation,
};

// "read-before-write", "write-during-read", ...
std::string_view HazardKindName(HazardKind kind);

// One operation as the detector knows it.
struct AccessOp {
  Epoch epoch;        // the operation's own stamp
  std::string label;  // e.g. "op 7 copy device->pinned on 'd2h'"
};

struct Hazard {
  HazardKind kind;
  std::string earlier;  // label of the operation enqueued first
  std::string later;    // label of the operation enqueued second
  std::string memory;   // e.g. "device#3 bytes [0, 4096)"

  // "<kind>: <later> vs <earlier> on <memory>".
  std::string ToString() const;
};

class HazardDetector {
 public:
  // A new allocation, identified by `block`. `alloc` is the allocating
  // operation; accesses must be ordered after it. REQUIRES: `block` is new.
  void OnAllocate(uint64_t block, std::string name, AccessOp alloc);

  // An access of bytes [begin, end) of `block` by the operation stamped
  // `op.epoch`, whose full clock is `clock`. REQUIRES: `block` was allocated.
  void OnRead(uint64_t block, int64_t begin, int64_t end, const AccessOp& op,
              const VectorClock& clock);
  void OnWrite(uint64_t block, int64_t begin, int64_t end, const AccessOp& op,
               const VectorClock& clock);

  // The free of `block`; every access must be ordered before it, and any
  // access enqueued after it is a use-after-free. REQUIRES: `block` allocated.
  void OnFree(uint64_t block, const AccessOp& op, const VectorClock& clock);

  const std::vector<Hazard>& hazards() const { return hazards_; }

 private:
  struct Access {
    int64_t begin;
    int64_t end;
    bool write;
    AccessOp op;
  };
  struct BlockState {
    std::string name;
    AccessOp alloc;
    bool freed = false;
    AccessOp free;
    std::vector<Access> accesses;  // pruned: see OnAccess
  };

  void OnAccess(uint64_t block, int64_t begin, int64_t end, bool write,
                const AccessOp& op, const VectorClock& clock);
  void Report(HazardKind kind, const AccessOp& earlier, const AccessOp& later,
              const BlockState& state, int64_t begin, int64_t end);

  std::unordered_map<uint64_t, BlockState> blocks_;
  std::vector<Hazard> hazards_;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_HAZARD_DETECTOR_H_
