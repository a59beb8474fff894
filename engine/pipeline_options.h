// Options of the fine-grained front door (engine/pipeline_offload.h), in a
// header of their own so that its policy (engine/pipeline/) can use them
// without the front door.

#ifndef OFFLOAD_ENGINE_PIPELINE_OPTIONS_H_
#define OFFLOAD_ENGINE_PIPELINE_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace offload {

struct PipelineOffloadOptions {
  bool enabled = true;
  // Megatron's --offload-modules: the group names that are offloaded.
  // Groups of other names are tracked but their tensors stay on device.
  std::vector<std::string> offload_modules;
  // --min-offloaded-tensor-size (SPEC §1.2).
  int64_t min_offload_elements = 1024 * 1024;
  // --activation-offload-fraction, in [0, 1] (§5.4c).
  double activation_offload_fraction = 1.0;
  // --delta-offload-bytes-across-pp-ranks with this rank's pipeline rank:
  // pipeline_rank × delta bytes stay on device (§5.4b).
  int64_t delta_offload_bytes = 0;
  int pipeline_rank = 0;
  // Virtual pipeline stages (interleaved 1F1B); 1 without.
  int virtual_stages = 1;
  // Per group name: at most this many of its offloads in flight per chunk
  // before the compute stream waits for the oldest; 0 waits after every
  // commit; a name not listed has no cap (§5.6).
  std::map<std::string, int> max_inflight;
  // Pool pinned buffers by (bytes, dtype) across groups and iterations
  // (§5.5); off: each group allocates and frees its own.
  bool pinned_pool = true;
  // Megatron's --delay-offload-until-cuda-graph (§5.7): GroupCommit queues
  // the offload instead of issuing it; IssueDelayedOffloads issues the
  // queue (right after a captured region's launch). Whatever is still
  // queued when a backward starts or the iteration ends is issued then,
  // with a warning naming it — never dropped. The copies of a queued group
  // are ordered after everything enqueued on the compute stream when its
  // offload is issued (not after its pushes), so a region whose kernels
  // run in a Launch after the host calls (or were captured with them) is
  // copied as that launch wrote it.
  bool delay_offload = false;

  // As in OffloadOptions.
  double min_span_coverage = 0.5;
  bool skip_sparse_views = false;
  bool warnings_to_stderr = false;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_OPTIONS_H_
