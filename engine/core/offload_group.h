// OffloadGroup: one group of saved tensors and how it moves (SPEC §2, §3).
//
//   not_offloaded --StartOffload--> offload_started --ReleaseForwardMemory-->
//   offload_finished --StartReload--> reload_started --ReleaseAll--> released
//
// When pinned memory cannot be had or the offload cannot be enqueued,
// StartOffload leaves the group kept_on_device (a warning; pops return the
// tensors as pushed); ReleaseForwardMemory and StartReload are then no-ops.
// ReleaseAll is allowed from every state. A call in the wrong state returns
// kFailedPrecondition naming the group, the call and the state, and changes
// nothing. Mechanism only: which group moves when is the front door's
// policy.

#ifndef OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_H_
#define OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/core/offload_core.h"
#include "engine/core/span_planner.h"
#include "engine/offload_stats.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

class OffloadGroup {
 public:
  // As `pinned_tag`: pool each span's buffer under its dtype (SPEC §5.5's
  // pool keyed by bytes and dtype, shared by all groups) rather than under
  // one tag of the group's own.
  static constexpr int64_t kPinnedTagPerDType = -2;

  // `core` must outlive the group. `label` names the group in messages
  // (the front door decides what a group is: "layer 3", "layer 3 unit 12",
  // "group 'core_attn' #0 of chunk (stage 0, microbatch 1)"). `pinned_tag`
  // is the PinnedPool tag of the group's retained buffers (>= 0), or
  // kPinnedTagPerDType.
  OffloadGroup(OffloadCore& core, std::string label, int64_t pinned_tag)
      : core_(core), label_(std::move(label)), pinned_tag_(pinned_tag) {}
  ~OffloadGroup();
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  const std::string& label() const { return label_; }
  GroupState state() const { return state_; }
  int size() const { return static_cast<int>(entries_.size()); }

  // Adds a tensor pushed during the group's forward; its bytes are final
  // once `ready` completes. `ready_from_push` says that `ready` is the event
  // NextPushEvent returned last, recorded on the compute stream by the push:
  // such points are ordered, so a copy waits only for the latest of them.
  // Returns its index for Pop.
  // REQUIRES: state() == kNotOffloaded; `tensor` is a valid device tensor.
  int Add(const Tensor& tensor, std::shared_ptr<Event> ready,
          bool ready_from_push);

  // An event for Push to record on the compute stream (reused across
  // iterations). Errors: what Backend::NewEvent returns.
  StatusOr<std::shared_ptr<Event>> NextPushEvent();

  // Plans spans (span_planner.h), makes sparse views contiguous on the
  // compute stream (or leaves them, with skip_sparse_views), takes pinned
  // blocks (from the pool when `retain_pinned`; spans of one pool tag share
  // one, as StartReload's device block), and enqueues each span's
  // D2H copy after the ready points of all its tensors, then records the
  // group's finish event. If pinned memory cannot be had or a copy cannot
  // be enqueued, the group is kept on device (a warning).
  // Errors: kFailedPrecondition in another state; kInvalidArgument naming
  //   the group when `retain_pinned` and this iteration's spans do not fit
  //   the buffers retained from an earlier iteration (SPEC §3.5: shapes
  //   must not change) — then the group is kept on device for this
  //   iteration, the retained buffers are given back (ordered after their
  //   last copy), and the next iteration's StartOffload takes new ones.
  Status StartOffload(bool retain_pinned);

  // The pinned blocks, as (bytes, pool tag), that StartOffload would take
  // for the tensors added so far; changes nothing. For a graph capture,
  // which must find them pooled (it cannot allocate pinned memory).
  std::vector<std::pair<int64_t, int64_t>> PlannedHostBlocks() const;

  // The compute stream waits for the finish event; the group drops its
  // device storages (freeing those nobody else holds, on the compute
  // stream). A no-op when kept on device.
  // Errors: kFailedPrecondition unless offload_started or kept on device;
  //   what the ordering wait returns (then nothing changed).
  Status ReleaseForwardMemory();

  // The fine-grained mode's release (SPEC §5.1): the device storages go
  // back after the copies that read them without the compute stream
  // waiting. The D2H stream is ordered after the compute stream's current
  // point, then each span's storage that nobody else holds, and each
  // storage in `force` that a span of this group copied (upstream's
  // release_tensors: freed even though the caller holds it, whose views
  // then have no memory), is freed on the D2H stream. Storages the caller
  // still holds stay referenced until FreeDroppedStorages finds them
  // dropped, or ReleaseAll. A no-op when kept on device.
  // Errors: kFailedPrecondition unless offload_started or kept on device;
  //   what the ordering calls return (then nothing changed).
  Status ReleaseAfterCopies(const std::vector<const Storage*>& force);

  // After ReleaseAfterCopies: frees the storages the caller has dropped
  // since (ordered as there). Errors: what the ordering calls return (then
  // nothing changed); a failed free keeps that storage (the core's Keep).
  Status FreeDroppedStorages();
  // Whether ReleaseAfterCopies left storages the caller still holds.
  bool holds_caller_storages() const;

  // The compute stream waits until the group's copies to host are done (the
  // fine-grained mode's in-flight cap, SPEC §5.6). A no-op unless the
  // offload was enqueued. Errors: what Wait returns.
  Status ComputeWaitsForOffload();

  // Whether a tensor of the group (not yet copied) views `storage`.
  bool References(const Storage* storage) const;
  // Whether a tensor of the group that no span copies (left on device)
  // views `storage`.
  bool LeavesOnDevice(const Storage* storage) const;
  // Whether a span of the group copies (or copied) `storage`, and still
  // holds it.
  bool CopiesStorage(const Storage* storage) const;
  // Bytes of spans copied to host whose storage the group still holds
  // because the caller keeps it (after ReleaseAfterCopies).
  int64_t caller_held_bytes() const;
  // Bytes the group's spans copied to host in this iteration.
  int64_t copied_bytes() const { return copied_bytes_; }

  // Allocates one device block for all spans (each a sub-range of it, a
  // BlockSlice; a span whose size is not a multiple of 256 bytes ends its
  // block, see PackByTag; while the compute stream is capturing a graph,
  // one block per span) on the compute stream, makes the H2D stream wait for that
  // point (and for the group's copies to host when ReleaseAfterCopies
  // released without the compute stream waiting), copies each span back in
  // span order and records one event per span. A no-op when kept on device.
  // Errors: kFailedPrecondition unless offload_finished or kept on device;
  //   kResourceExhausted if device memory runs out, or what an ordering or
  //   copy call returns (nothing changed; the host copy stays for a retry).
  Status StartReload();

  // The tensor of `index` as pushed. After a reload it is a view of the
  // reloaded span, and the compute stream waits for that span's event
  // unless it already waited for a later span's (which covers it).
  // Errors: kFailedPrecondition if the device memory was released and no
  //   reload started, or the group was released; what the wait returns.
  StatusOr<Tensor> Pop(int index);

  // Drops every device reference and pinned buffer (pooling the pinned
  // buffers under the group's tag when `retain_pinned`), each freed ordered
  // after the work that uses it — and storages no copy read after their
  // producer's ready event. The group ends released even on error.
  // Errors: an ordering call failed; the memory it ordered is kept by the
  //   core (warned), never freed unordered.
  Status ReleaseAll(bool retain_pinned);

  // SPEC §7.3: the group's backward ended but its graph may be traversed
  // again. From reload_started, frees the reloaded spans (ordered as
  // ReleaseAll does; spans the caller still holds go with their last
  // holder) and returns to offload_finished: the host copy stays, and a
  // later StartReload brings it back again. A no-op in any other state.
  // Errors: an ordering call failed (that memory is kept, warned); the
  //   group is back in offload_finished all the same.
  Status DropReloaded();

  // Push's path: records the tensor's ready point on the compute stream
  // when it has none, and adds it. Returns its index for Pop.
  // Errors: what NewEvent or Record return (nothing added).
  // REQUIRES: as for Add.
  StatusOr<int> AddPushed(const Tensor& tensor);

  // Removes the entries from `size` on (a push that failed half-way).
  // REQUIRES: state() == kNotOffloaded.
  void Truncate(int size);

  // Readies the group for the next iteration. REQUIRES: released or never
  // offloaded.
  void BeginIteration();

  // Bytes of pinned memory the group holds (not counting pooled buffers).
  int64_t host_bytes() const;

  // "layer 3 (offload_started)".
  std::string Where() const;

 private:
  struct Entry {
    Tensor tensor;          // as pushed (the storage is dropped at release)
    std::shared_ptr<Event> ready;
    int push_order = -1;    // index of its push event; -1: its own event
    int span = -1;          // -1: stays on device
    int64_t byte_offset = 0;  // of the view's first element in its storage
  };
  struct Span {
    std::shared_ptr<Storage> device;    // until ReleaseForwardMemory
    std::shared_ptr<Storage> reloaded;  // after StartReload
    int64_t begin = 0;
    int64_t bytes = 0;
    std::vector<int> entries;
    bool waited = false;  // the compute stream already waits for its reload
    int host_block = -1;       // its pinned block in host_
    int64_t host_offset = 0;   // and its offset there
  };

  // The spans StartOffload copies and the pinned bytes and pool tag of each.
  struct HostNeeds {
    SpanPlan plan;
    std::vector<int64_t> sizes;
    std::vector<int64_t> tags;
  };
  HostNeeds PlanHost() const;
  Status WrongState(const char* call) const;
  StatusOr<Event*> EnsureEvent(std::unique_ptr<Event>& event);
  // Keeps the group on device after a failed StartOffload, with a warning.
  void KeepOnDevice(const std::string& why);
  // Replaces sparse entry `index` by a contiguous copy made on the compute
  // stream; false (and a warning) if that cannot be done.
  bool MakeContiguous(int index, double coverage);
  // Records the gathered point if `gathered` (contiguous copies were made),
  // then enqueues the D2H copies of every span and the finish event.
  Status EnqueueOffloadCopies(bool gathered);
  // Drops the device storages of spans (and contiguous copies); frees those
  // nobody else holds. REQUIRES: the compute stream is ordered after every
  // copy that reads them, or `ordered` is false: then they are kept by the
  // core instead of freed.
  Status DropDeviceStorages(bool ordered, const Status& why);
  // Makes the compute stream wait for the ready point of every entry no copy
  // ordered (see ReleaseAll); keeps those it cannot order.
  Status OrderAfterProducers();
  // The span's bytes in its pinned block.
  void* HostData(const Span& span) const;
  // Frees (or pools) the pinned buffers after the last copy using them.
  Status ReleaseHost(bool retain_pinned);
  // Frees (or leaves to their outside holder) the reloaded spans, each
  // ordered after its reload and its readers.
  Status FreeReloaded();
  // The pool tag of each span's pinned buffer.
  std::vector<int64_t> SpanTags() const;
  // Makes the D2H stream wait for the compute stream's current point.
  Status OrderD2HAfterCompute();
  // Frees, on the D2H stream, the spans' storages that nobody else holds
  // and those in `force`; a failed free keeps the storage (core's Keep).
  // REQUIRES: OrderD2HAfterCompute just succeeded.
  Status FreeDue(const std::vector<const Storage*>& force);

  OffloadCore& core_;
  const std::string label_;
  const int64_t pinned_tag_;
  GroupState state_ = GroupState::kNotOffloaded;
  // Copies may read the device storages (enqueued before a failure kept
  // the group on device): whatever frees them must be ordered after d2h.
  bool copies_pending_ = false;
  // ReleaseAfterCopies released without the compute stream waiting for the
  // copies: the reload (and whatever frees what is left) must wait for them.
  bool released_unordered_ = false;
  int64_t copied_bytes_ = 0;
  std::vector<Entry> entries_;
  std::vector<Span> spans_;
  // Pinned blocks: one per pool tag among the spans (one per group unless
  // pooled per dtype), each span a sub-range of one.
  std::vector<Buffer> host_;
  std::vector<int64_t> host_tags_;  // their pool tags
  int64_t host_span_bytes_ = 0;     // the spans' bytes in them
  // Span sizes of the first iteration, when pinned buffers are retained.
  std::vector<int64_t> retained_sizes_;
  // Events, reused across iterations.
  std::vector<std::shared_ptr<Event>> push_events_;
  size_t next_push_event_ = 0;
  std::unique_ptr<Event> offload_done_;  // on the D2H stream
  std::unique_ptr<Event> gathered_;      // on compute, after contiguous copies
  std::unique_ptr<Event> reload_point_;  // on compute, after reload allocations
  std::unique_ptr<Event> order_point_;   // scratch for ComputeWaitsFor
  std::vector<std::unique_ptr<Event>> span_reloaded_;
  Stream* host_last_user_ = nullptr;  // the stream that last used host_
};

// Ends an iteration for a front door's `groups` (null entries skipped):
// each group not yet released is released (ReleaseAll) and every group is
// readied for the next iteration; then the core's kept memory is retried.
// The iteration ends whatever fails; memory whose free could not be ordered
// stays kept (warned). Errors: the first failure.
Status EndIteration(OffloadCore& core,
                    std::vector<std::unique_ptr<OffloadGroup>>& groups,
                    bool retain_pinned);

// Whether any of a front door's `groups` (null entries skipped) holds a
// tensor pushed in this iteration: an iteration that holds none has nothing
// to release when it is dropped (SPEC §7.2).
bool AnyPushed(const std::vector<std::unique_ptr<OffloadGroup>>& groups);

// Ends a backward traversal for a front door's `groups` (SPEC §7.3): each
// group's reloaded memory is released (DropReloaded), host copies stay;
// then the core's kept memory is retried. Every group is handled whatever
// fails. Errors: the first failure.
Status EndTraversal(OffloadCore& core,
                    std::vector<std::unique_ptr<OffloadGroup>>& groups);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_OFFLOAD_GROUP_H_
