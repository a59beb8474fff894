// The span planner (SPEC §2; TE calls it the group processor): decides,
// for the tensors of one group, which byte spans of which storages to copy.
//
// It works per storage, not per tensor: every view of a storage is served by
// one span covering it, copied once, and rebuilt after reload as a view with
// its own shape, strides and offset relative to the span. Identical views and
// the same tensor saved twice share everything. A view that covers too little
// of the bytes it reaches (x[::8] of a large x) is reported as sparse: the
// caller makes it contiguous (or skips it) rather than copying bytes nobody
// needs.
//
// Pure: no backend, no side effects.

#ifndef OFFLOAD_ENGINE_CORE_SPAN_PLANNER_H_
#define OFFLOAD_ENGINE_CORE_SPAN_PLANNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace offload {

// Span starts are aligned down to this many bytes, so that every view's
// offset stays a whole number of elements relative to its span, and copies
// start aligned.
inline constexpr int64_t kSpanAlignment = 256;

// Bytes [begin, end) of one storage, and the tensors it serves.
struct PlannedSpan {
  std::shared_ptr<Storage> storage;
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int> tensors;  // indices into the planned list

  int64_t bytes() const { return end - begin; }
};

struct SpanPlan {
  std::vector<PlannedSpan> spans;
  // Tensors whose own view is too sparse to copy its extent; each needs a
  // contiguous copy of its own (or to stay on device).
  std::vector<int> sparse;
  // For each sparse tensor, the fraction of its byte extent it covers.
  std::vector<double> sparse_coverage;
};

// Plans `tensors` (all well-formed views of device storages). Per storage:
//  - if any view has the offload_base flag, one span covers the storage;
//  - else if the views together cover at least `min_coverage` of the bytes
//    from the lowest to the highest byte they reach, one span covers that;
//  - else each view dense enough on its own gets a span of its own extent
//    (overlapping ones merged), and the rest are sparse.
// Views of no elements join no span and are not sparse. Spans come per
// storage in order of first use, by address within a storage; a span's
// tensors and the sparse list are in input order.
SpanPlan PlanSpans(const std::vector<const Tensor*>& tensors,
                    double min_coverage);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_SPAN_PLANNER_H_
