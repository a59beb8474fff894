// One offload group (a layer's saved tensors) and its life cycle (SPEC §3):
//
//   not_offloaded --StartOffload--> offload_started --ReleaseForwardMemory-->
//   offload_finished --StartReload--> reload_started --ReleaseAll--> released
//
// ReleaseAll is allowed from every state (end of backward or iteration). A
// call in the wrong state returns kFailedPrecondition naming the layer, the
// call and the state, and changes nothing. Internal to the Offloader.

#ifndef OFFLOAD_ENGINE_GROUP_H_
#define OFFLOAD_ENGINE_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/diagnostics.h"
#include "engine/offload_options.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// What a group uses of its Offloader.
struct GroupContext {
  Backend* backend = nullptr;
  Stream* compute = nullptr;
  Stream* d2h = nullptr;
  Stream* h2d = nullptr;
  const OffloadOptions* options = nullptr;
  Diagnostics* diagnostics = nullptr;
  OffloaderStats* stats = nullptr;
};

class Group {
 public:
  explicit Group(int layer) : layer_(layer) {}

  int layer() const { return layer_; }
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
  StatusOr<std::shared_ptr<Event>> NextPushEvent(const GroupContext& ctx);

  // Plans spans (group_processor.h), makes sparse views contiguous on the
  // compute stream (or leaves them, with skip_sparse_views), allocates or
  // reuses pinned buffers, and enqueues each span's D2H copy after the ready
  // points of all its tensors, then records the group's finish event.
  // If pinned memory cannot be had or a copy cannot be enqueued, the group
  // stays on device (a warning; pops return the tensors as pushed).
  // Errors: kFailedPrecondition in another state, or when retained pinned
  //   buffers do not fit this iteration's spans.
  Status StartOffload(const GroupContext& ctx);

  // The compute stream waits for the finish event; the group drops its
  // device storages (freeing those nobody else holds, on the compute
  // stream). Errors: kFailedPrecondition unless offload_started.
  Status ReleaseForwardMemory(const GroupContext& ctx);

  // Allocates device memory for every span on the compute stream, makes the
  // H2D stream wait for that point, copies each span back and records one
  // event per span. Errors: kFailedPrecondition unless offload_finished;
  // kResourceExhausted if device memory runs out (nothing changed; the host
  // copy stays for a retry).
  Status StartReload(const GroupContext& ctx);

  // The tensor of `index` as pushed. After a reload it is a view of the
  // reloaded span, and the compute stream waits for that span's event.
  // Errors: kFailedPrecondition if the device memory was released and no
  //   reload started, or the group was released.
  StatusOr<Tensor> Pop(int index, const GroupContext& ctx);

  // Drops every device reference and pinned buffer (keeping the pinned
  // buffers for the next iteration when `keep_pinned`), each freed ordered
  // after the work that uses it.
  void ReleaseAll(const GroupContext& ctx, bool keep_pinned);

  // For the Offloader's destruction: ReleaseAll, and retained pinned buffers
  // freed too, all ordered after the copies that use them.
  void Shutdown(const GroupContext& ctx);

  // Readies the group for the next iteration. REQUIRES: released or never
  // offloaded.
  void BeginIteration();

  // Bytes of pinned memory the group holds.
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
  };

  Status WrongState(const char* call) const;
  StatusOr<Event*> EnsureEvent(std::unique_ptr<Event>& event,
                               const GroupContext& ctx);
  // Replaces sparse entry `index` by a contiguous copy made on the compute
  // stream; false (and a warning) if device memory cannot be had.
  bool MakeContiguous(int index, double coverage, const GroupContext& ctx);
  // Frees the pinned buffers on the stream of the last copy using them.
  void FreeHost(const GroupContext& ctx);
  // Records the gathered point if `gathered` (contiguous copies were made),
  // then enqueues the D2H copies of every span and the finish event.
  Status EnqueueOffloadCopies(bool gathered, const GroupContext& ctx);
  // Drops the device storages of spans (and contiguous copies); frees those
  // nobody else holds. Waits first if copies may still read them.
  void DropDeviceStorages(const GroupContext& ctx);

  const int layer_;
  GroupState state_ = GroupState::kNotOffloaded;
  bool on_device_ = false;  // pinned memory failed: nothing was offloaded
  std::vector<Entry> entries_;
  std::vector<Span> spans_;
  std::vector<Buffer> host_;  // one per span; kept across iterations if retained
  // Events, reused across iterations.
  std::vector<std::shared_ptr<Event>> push_events_;
  size_t next_push_event_ = 0;
  std::unique_ptr<Event> offload_done_;  // on the D2H stream
  std::unique_ptr<Event> gathered_;      // on compute, after contiguous copies
  std::unique_ptr<Event> reload_point_;  // on compute, after reload allocations
  std::unique_ptr<Event> host_free_;     // when retained pinned buffers are free
  std::vector<std::unique_ptr<Event>> span_reloaded_;
  bool host_free_pending_ = false;
  Stream* host_last_user_ = nullptr;  // the stream that last used host_
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_GROUP_H_
