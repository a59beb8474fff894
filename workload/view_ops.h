// View recipes: a list of view operations (slice, select, transpose,
// reshape) that a workload spec applies to a buffer to get the tensor a layer
// saves, replayed with workload/tensor_util.h's view helpers.

#ifndef OFFLOAD_WORKLOAD_VIEW_OPS_H_
#define OFFLOAD_WORKLOAD_VIEW_OPS_H_

#include <cstdint>
#include <vector>

#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// One step of a view recipe (workload/tensor_util.h's view helpers).
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

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_VIEW_OPS_H_
