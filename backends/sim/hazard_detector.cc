#include "backends/sim/hazard_detector.h"

#include <algorithm>
#include <utility>

namespace offload {

std::string_view HazardKindName(HazardKind kind) {
  switch (kind) {
    case HazardKind::kReadBeforeWrite:
      return "read-before-write";
    case HazardKind::kWriteDuringRead:
      return "write-during-read";
    case HazardKind::kWriteAfterWrite:
      return "write-after-write";
    case HazardKind::kFreeDuringUse:
      return "free-during-use";
    case HazardKind::kUseAfterFree:
      return "use-after-free";
    case HazardKind::kUseBeforeAllocation:
      return "use-before-allocation";
  }
  return "unknown";
}

std::string Hazard::ToString() const {
  std::string out(HazardKindName(kind));
  out += ": ";
  out += later;
  out += " vs ";
  out += earlier;
  out += " on ";
  out += memory;
  return out;
}

void HazardDetector::OnAllocate(uint64_t block, std::string name,
                                AccessOp alloc) {
  BlockState& state = blocks_[block];
  state.name = std::move(name);
  state.alloc = std::move(alloc);
}

void HazardDetector::OnRead(uint64_t block, int64_t begin, int64_t end,
                            const AccessOp& op, const VectorClock& clock) {
  OnAccess(block, begin, end, /*write=*/false, op, clock);
}

void HazardDetector::OnWrite(uint64_t block, int64_t begin, int64_t end,
                             const AccessOp& op, const VectorClock& clock) {
  OnAccess(block, begin, end, /*write=*/true, op, clock);
}

void HazardDetector::OnAccess(uint64_t block, int64_t begin, int64_t end,
                              bool write, const AccessOp& op,
                              const VectorClock& clock) {
  BlockState& state = blocks_.at(block);
  if (state.freed) {
    Report(HazardKind::kUseAfterFree, state.free, op, state, begin, end);
    return;
  }
  if (!clock.Covers(state.alloc.epoch)) {
    Report(HazardKind::kUseBeforeAllocation, state.alloc, op, state, begin,
           end);
  }
  for (const Access& earlier : state.accesses) {
    if (earlier.end <= begin || end <= earlier.begin) continue;  // disjoint
    if (!earlier.write && !write) continue;  // two reads never conflict
    if (clock.Covers(earlier.op.epoch)) continue;  // ordered
    HazardKind kind = !write ? HazardKind::kReadBeforeWrite
                      : earlier.write ? HazardKind::kWriteAfterWrite
                                      : HazardKind::kWriteDuringRead;
    Report(kind, earlier.op, op, state, std::max(begin, earlier.begin),
           std::min(end, earlier.end));
  }
  // Prune what the new access subsumes: an earlier access inside its range
  // that happens before it, unless the earlier one wrote and the new one only
  // reads. Any later access that conflicts with the pruned one is either
  // ordered after it (through the new access) or conflicts with the new
  // access itself, so no hazard goes unreported.
  std::erase_if(state.accesses, [&](const Access& earlier) {
    return begin <= earlier.begin && earlier.end <= end &&
           (write || !earlier.write) && clock.Covers(earlier.op.epoch);
  });
  state.accesses.push_back(Access{begin, end, write, op});
}

void HazardDetector::OnFree(uint64_t block, const AccessOp& op,
                            const VectorClock& clock) {
  BlockState& state = blocks_.at(block);
  if (state.freed) {
    Report(HazardKind::kUseAfterFree, state.free, op, state, 0, 0);
    return;
  }
  if (!clock.Covers(state.alloc.epoch)) {
    Report(HazardKind::kUseBeforeAllocation, state.alloc, op, state, 0, 0);
  }
  for (const Access& earlier : state.accesses) {
    if (!clock.Covers(earlier.op.epoch)) {
      Report(HazardKind::kFreeDuringUse, earlier.op, op, state, earlier.begin,
             earlier.end);
    }
  }
  state.freed = true;
  state.free = op;
  state.accesses.clear();
}

void HazardDetector::Report(HazardKind kind, const AccessOp& earlier,
                            const AccessOp& later, const BlockState& state,
                            int64_t begin, int64_t end) {
  hazards_.push_back(Hazard{
      kind, earlier.label, later.label,
      state.name + " bytes [" + std::to_string(begin) + ", " +
          std::to_string(end) + ")"});
}

}  // namespace offload
