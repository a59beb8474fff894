#include "workload/view_ops.h"

#include <utility>

#include "workload/tensor_util.h"

namespace offload {

ViewOp ViewOp::Slice(int dim, int64_t start, int64_t stop, int64_t step) {
  ViewOp op;
  op.kind = Kind::kSlice;
  op.dim = dim;
  op.start = start;
  op.stop = stop;
  op.step = step;
  return op;
}

ViewOp ViewOp::Select(int dim, int64_t index) {
  ViewOp op;
  op.kind = Kind::kSelect;
  op.dim = dim;
  op.start = index;
  return op;
}

ViewOp ViewOp::Transpose(int d0, int d1) {
  ViewOp op;
  op.kind = Kind::kTranspose;
  op.dim = d0;
  op.dim2 = d1;
  return op;
}

ViewOp ViewOp::Reshape(std::vector<int64_t> shape) {
  ViewOp op;
  op.kind = Kind::kReshape;
  op.shape = std::move(shape);
  return op;
}

StatusOr<Tensor> ApplyViewOps(const Tensor& tensor,
                              const std::vector<ViewOp>& ops) {
  Tensor view = tensor;
  for (const ViewOp& op : ops) {
    StatusOr<Tensor> next = InvalidArgumentError("unknown view op");
    switch (op.kind) {
      case ViewOp::Kind::kSlice:
        next = Slice(view, op.dim, op.start, op.stop, op.step);
        break;
      case ViewOp::Kind::kSelect:
        next = Select(view, op.dim, op.start);
        break;
      case ViewOp::Kind::kTranspose:
        next = Transpose(view, op.dim, op.dim2);
        break;
      case ViewOp::Kind::kReshape:
        next = Reshape(view, op.shape);
        break;
    }
    if (!next.ok()) return next.status();
    view = std::move(next).value();
  }
  return view;
}

}  // namespace offload
