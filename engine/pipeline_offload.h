// The fine-grained, pipeline-aware front door, after Megatron-LM's
// fine-grained activation offloading (SPEC §5).
//
// One PipelineOffloader serves one pipeline rank (no singleton: each rank,
// or each test, makes its own). The caller drives it like Megatron's hooks:
//
//   per iteration, in the rank's schedule (1F1B, interleaved 1F1B, ...):
//     forward of a chunk:   StartChunk(stage, microbatch)
//       per named submodule:  GroupStart("core_attn")
//                             saved = Push(t) ...        (pack hook)
//                             GroupCommit("core_attn", {tensors to free})
//     backward of a chunk:  StartChunkBackward(stage, microbatch)
//       per group, in reverse commit order:
//                             GroupBackwardStart("core_attn")
//                             t = Pop(saved) ...         (unpack hook)
//                             GroupBackwardEnd("core_attn")
//   FinishIteration()
//
// Groups nest (attn_norm encloses qkv_linear, core_attn and attn_proj); a
// push goes to the innermost open group, and a push outside every group is
// handed back untouched. A group whose name is offloaded copies its tensors
// to pinned host memory at commit, on a D2H stream, and its device memory
// goes back once those copies are done — the compute stream never waits for
// them (unless max_inflight says so). In backward, the end of a group's
// backward reloads the next offloaded group (§5.3); a group nobody reloaded
// ahead is reloaded, correctly ordered after its own copies, when its
// backward starts or its first tensor is popped.
//
// The first iteration is the warm-up: it offloads every group whose name is
// offloaded and records what it saw. FinishIteration then freezes the plan
// (§5.4: margin, pipeline-rank delta, fraction) and the summary. Later
// iterations must run the same chunks and groups (kFailedPrecondition
// otherwise). Every call returns a Status; a failed call changes nothing
// unless its comment says otherwise. No call blocks the host.

#ifndef OFFLOAD_ENGINE_PIPELINE_OFFLOAD_H_
#define OFFLOAD_ENGINE_PIPELINE_OFFLOAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/diagnostics.h"
#include "engine/offload_stats.h"
#include "engine/pipeline_options.h"
#include "engine/pipeline_summary.h"
#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class PipelinePolicy;  // engine/pipeline/pipeline_policy.h, private

class PipelineOffloader {
 public:
  // Errors: kInvalidArgument for a fraction outside [0, 1] (or NaN),
  //   min_offload_elements, delta_offload_bytes or pipeline_rank < 0,
  //   pipeline_rank × delta_offload_bytes beyond int64,
  //   virtual_stages outside [1, 1024], an empty or repeated module name,
  //   a negative max_inflight, min_span_coverage outside [0, 1].
  static StatusOr<std::unique_ptr<PipelineOffloader>> Create(
      Backend& backend, const PipelineOffloadOptions& options);
  ~PipelineOffloader();
  PipelineOffloader(const PipelineOffloader&) = delete;
  PipelineOffloader& operator=(const PipelineOffloader&) = delete;

  // --- Forward -------------------------------------------------------------
  // Starts the forward of chunk (stage, microbatch); the previous chunk's
  // forward ends. Errors: kInvalidArgument for a stage outside
  //   [0, virtual_stages) or a negative microbatch; kFailedPrecondition if
  //   that chunk already ran this iteration, a group of the previous chunk
  //   is still open, or (after warm-up) it is not the chunk warm-up ran
  //   at this position or the previous chunk ran other groups; what the
  //   ordering calls of freeing memory the caller dropped since a commit
  //   return (then nothing changed; retry).
  Status StartChunk(int stage, int microbatch);

  // Opens group `name` in the current forward chunk (nested inside the
  // groups open now). Errors: kFailedPrecondition with no chunk's forward
  //   running, or (after warm-up) a group warm-up did not run here; as
  //   StartChunk for freeing dropped memory (nothing changed).
  Status GroupStart(std::string_view name);

  // The pack hook: into the innermost open group. Never-offloaded tensors
  // (§1.2), pushes outside any group and into groups that are not
  // offloaded come back from Pop unchanged. A composite is pushed whole or
  // not at all. Errors: kInvalidArgument for a malformed tensor, or one the
  //   group would copy whose storage or ready event is of another backend;
  //   kFailedPrecondition into an offloaded group while the compute stream
  //   is capturing, without delay_offload (see GroupCommit); what recording
  //   its ready point returns.
  StatusOr<SavedTensor> Push(const Tensor& tensor);
  StatusOr<SavedTensor> Push(const CompositeTensor& tensor);

  // Closes the latest open group named `name` of the current forward chunk.
  // If it is offloaded: plans its spans, enqueues the copies to host and
  // releases its device memory after them — for each storage nobody else
  // holds, and for the storages of `release_tensors` that this group
  // copied (upstream's forced release: their memory goes even though the
  // caller holds them; release tensors the group did not copy, that an
  // open group still has to copy, or that another live handle of this
  // iteration still reads — a kept handle, a tensor of a group on device,
  // a view of this group left on device — are left alone with a warning:
  // the group frees those once nobody holds them, so a Pop never returns
  // a tensor without memory).
  // Graph capture (§5.7): while the compute stream is capturing
  // (Backend::IsCapturing), committing an offloaded group without
  // delay_offload is kFailedPrecondition naming the group (nothing
  // changed; the group stays open): its offload is not capture-safe
  // (pinned allocation, cross-stream ordering and the release would land
  // in the graph). With delay_offload the commit is queued as usual.
  // Errors: kFailedPrecondition if no such group is open; as StartChunk
  //   for freeing dropped memory (nothing changed: retry); what an ordering
  //   call of the group's own offload returns — then the group is
  //   committed ("(committed)" in the message; do not retry), and its
  //   tensors stay on device until its backward, correct as pushed.
  Status GroupCommit(std::string_view name,
                     const std::vector<Tensor>& release_tensors = {});

  // delay_offload: issues every queued offload, in commit order, each
  // ordered after the work enqueued on the compute stream so far (call it
  // right after the region's Launch: the copies run outside the graph).
  // Errors: kFailedPrecondition while the compute stream is capturing
  //   (issued there the copies would be captured into the graph; nothing
  //   changes, the queue stays: call it after the region's Launch); the
  //   first that an offload's ordering calls return (the rest are issued
  //   even then). StartChunkBackward and FinishIteration, which issue what
  //   is still queued, likewise fail while capturing if anything is.
  Status IssueDelayedOffloads();

  // --- Backward ------------------------------------------------------------
  // Starts the backward of chunk (stage, microbatch). Errors:
  //   kFailedPrecondition unless it is the next chunk in backward order
  //   (§5.2; the message names the expected one), its forward has ended
  //   with no group open, and every group of the previous backward chunk
  //   ended its backward; what issuing still-queued delayed offloads
  //   returns (they are issued even then; the backward has not begun:
  //   call again).
  Status StartChunkBackward(int stage, int microbatch);

  // The backward of the next group, in reverse commit order, of the current
  // backward chunk begins; it must be named `name`. Starts its reload if
  // nobody did (ordered after its own copies to host). Errors:
  //   kFailedPrecondition if the next group has another name or none is
  //   left; kResourceExhausted if its reload finds no device memory (then
  //   nothing changed: retry).
  Status GroupBackwardStart(std::string_view name);

  // The unpack hook: the tensor as pushed (a sparse view made contiguous
  // comes back contiguous, as in the layer mode). A reloaded tensor makes
  // the compute stream wait for its own span's reload. A tensor of a group
  // whose reload never started is reloaded now, ordered after the group's
  // copies to host. Errors: kInvalidArgument for a handle of another
  //   offloader or iteration, or a composite passed to Pop and vice versa;
  //   kFailedPrecondition after the group's backward ended;
  //   kResourceExhausted if an inline reload finds no device memory.
  StatusOr<Tensor> Pop(const SavedTensor& saved);
  StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved);

  // The backward of the latest begun group named `name` ends: its memory
  // goes (pinned buffers back to the pool after the reload that reads them)
  // and the next offloaded group is reloaded (§5.3). Errors:
  //   kFailedPrecondition if no such group's backward is running; what a
  //   release or the reload returns (the group has ended even then).
  Status GroupBackwardEnd(std::string_view name);

  // Ends the iteration: every chunk's backward must have ended and every
  // virtual stage run as many chunks. After the warm-up iteration, freezes
  // the plan and the summary (warning about caller-held copies).
  // Errors: kFailedPrecondition naming what has not run (nothing changed).
  Status FinishIteration();

  // SPEC §7.2 for this door: the caller drops the iteration wherever it is
  // (a chunk's forward raised, a schedule step failed mid-way): every
  // group is released, each free ordered after the copies that read it;
  // offloads still queued by delay_offload are dropped unissued; a warning
  // names the iteration and how far it got; the next StartChunk begins a
  // new iteration. During the warm-up iteration its partial record is
  // discarded (the next iteration warms up again); after it, the frozen
  // plan stays. Handles of the dropped iteration are refused by Pop. An OK
  // no-op between iterations.
  // Errors: kFailedPrecondition while the compute stream is capturing
  //   (nothing changed); an ordering call failed (the iteration ended all
  //   the same, that memory is kept and warned).
  Status AbandonIteration();

  // --- Queries -------------------------------------------------------------
  bool warmed_up() const;
  // After warm-up: this rank's summary (SPEC §5.4).
  const std::optional<OffloadSummary>& summary() const;
  // After warm-up: the frozen decision of group `index` (commit order) of
  // chunk `chunk` (forward order); kNotEligible when out of range.
  GroupDecision Decision(int chunk, int index) const;
  // The state of the group `ordinal`-th named `name` in chunk (stage,
  // microbatch) of this iteration; kNotOffloaded if there is none.
  GroupState state(int stage, int microbatch, std::string_view name,
                   int ordinal) const;
  // Host bytes held (group buffers and the pool).
  int64_t OffloadedBytes() const;
  const Diagnostics& diagnostics() const;
  const OffloaderStats& stats() const;

 private:
  explicit PipelineOffloader(std::unique_ptr<PipelinePolicy> policy);
  std::unique_ptr<PipelinePolicy> policy_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_OFFLOAD_H_
