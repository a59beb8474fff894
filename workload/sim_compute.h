// The workload driver's device hooks (workload/workload.h) for the simulated
// GPU. Compute becomes SimKernels that declare the bytes they read and write,
// so the hazard detector checks, for instance, that a backward kernel reads a
// tensor only after its reload completed. Tensor creation and byte capture
// are zero-duration kernels whose bodies write or read the simulated bytes:
// unlike MakeDeviceTensor and CaptureByCopy they use no copy engine and no
// compute-stream time, so they leave the timeline of a run untouched.

#ifndef OFFLOAD_WORKLOAD_SIM_COMPUTE_H_
#define OFFLOAD_WORKLOAD_SIM_COMPUTE_H_

#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/tensor.h"
#include "workload/workload.h"

namespace offload {

// The byte extent of each tensor with elements, as simulator ranges.
std::vector<SimRange> SimRanges(const std::vector<const Tensor*>& tensors);

// Enqueues each call as one SimKernel named call.name, of call.duration_ns,
// reading and writing the byte extents of its tensors. The kernel changes no
// bytes. REQUIRES: `sim` outlives the function.
ComputeFn SimCompute(SimBackend& sim);

// MakeDeviceTensor's contract without a copy: allocates on the compute
// stream and enqueues a zero-duration kernel "fill <name>" writing the whole
// storage, whose body writes the pattern (when the simulator stores bytes).
// REQUIRES: the backend passed to the function is `sim`.
MakeTensorFn SimMakeTensor(SimBackend& sim);

// A CaptureFn: a zero-duration kernel "check <name>" on the compute stream
// reads the view's byte extent; its body keeps a copy of the bytes, which
// the future gathers. The future fails with kFailedPrecondition when the
// simulator stores no bytes, and with kInternal if called before the kernel
// ran.
CaptureFn SimCapture(SimBackend& sim);

// All of the above, with clock = sim.NowNs().
WorkloadHooks SimWorkloadHooks(SimBackend& sim);

}  // namespace offload

#endif  // OFFLOAD_WORKLOAD_SIM_COMPUTE_H_
