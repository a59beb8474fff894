// The tensor timeline of one step of the layer stack (layer_stack.h): its
// kernels in order and, for every activation, its size, the kernel that
// produces it and the kernels that read it. Recorded from RunStep itself on
// a SimBackend (no offloading, no bytes), so it is what layer_stack.cc
// does, not a second description of it. The memory-budget limit (limit.h)
// is computed from it.

#ifndef OFFLOAD_BENCH_LAYER_STACK_TIMELINE_H_
#define OFFLOAD_BENCH_LAYER_STACK_TIMELINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/layer_stack.h"

namespace offload::bench {

// One GEMM of the step, in compute-stream order.
struct StackKernel {
  int gemm = 0;   // 0..kGemms-1 (kGemmNames)
  int layer = 0;
  bool forward() const { return gemm < 5; }
};

// One activation allocated during the step.
struct StackTensor {
  std::string name;  // as NewActivation named it ("x0", "qkv", ...)
  int64_t bytes = 0;
  // The kernel that writes it; -1 for the step's input (filled before the
  // first kernel).
  int producer = -1;
  // The kernels that read it, in order: forward readers, then backward ones.
  std::vector<int> readers;
  // The kernel after which its forward push makes it ready to copy
  // (Shape::push_at): the producer with kGemm, the last forward GEMM of the
  // layer that pushes it with kLayer; -1 for the input with kGemm. Equal to
  // `producer` for tensors that are not saved.
  int ready = -1;
  // The last forward reader and the first backward reader; -1 when none.
  int last_forward_reader = -1;
  int first_backward_reader = -1;
  // Read in backward: pushed through the Offloader, may be offloaded.
  bool saved() const { return first_backward_reader >= 0; }
  // The last kernel that reads it (the producer when nothing does): its
  // memory is freed after that kernel ends.
  int last_use() const { return readers.empty() ? producer : readers.back(); }
};

struct StackTimeline {
  std::vector<StackKernel> kernels;  // s.layers * kGemms
  std::vector<StackTensor> tensors;  // in allocation order
};

// Runs one step of `s` through an Offloader that offloads nothing on a
// SimBackend and records what each kernel reads and writes.
StackTimeline RecordTimeline(const Shape& s);

// The most activation bytes live at the start of any kernel without
// offloading: tensors from their producer's start to their last use's start.
int64_t NoOffloadPeakBytes(const StackTimeline& t);

}  // namespace offload::bench

#endif  // OFFLOAD_BENCH_LAYER_STACK_TIMELINE_H_
