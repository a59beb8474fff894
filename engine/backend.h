// The device interface the offload engine is written against.
//
// Three small abstract classes with CUDA semantics: a Backend hands out
// streams, events and memory; a Stream is a FIFO of asynchronous device work;
// an Event marks a point in a stream that other streams and the host can wait
// for. Memory comes as move-only Buffer handles. The engine never calls CUDA:
// it is given a Backend& (backends/sim is a deterministic simulated GPU,
// backends/cuda the real one).
//
// Ordering rules, as in CUDA:
//  - Work on one stream runs in the order it was enqueued, one item at a time.
//  - Work on different streams is unordered unless an event orders it:
//    `b.Wait(e)` after `a.Record(e)` makes later work on `b` run after the work
//    enqueued on `a` before the Record.
//  - Device memory is stream-ordered: it may be used by work on the stream it
//    was allocated (or freed) on after the call, and by other streams only once
//    an event orders them after that point. Freed memory may be handed out
//    again to work ordered after the free, never to work that could still run
//    before it.
//
// Unless a method says otherwise, a failed call changes no state.

#ifndef OFFLOAD_ENGINE_BACKEND_H_
#define OFFLOAD_ENGINE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace offload {

class Backend;
class Stream;

enum class MemorySpace {
  kDevice,      // GPU memory; its addresses are not readable by the host.
  kPinnedHost,  // page-locked host memory; the host reads it directly.
};

// "device" or "pinned".
std::string_view MemorySpaceName(MemorySpace space);

// Owns one allocation of device or pinned memory. Move-only. An empty Buffer
// (default-constructed or moved-from) owns nothing.
//
// Destroying a non-empty Buffer returns its memory: device memory as
// `Backend::Free(buffer, *buffer.stream())` would (ordered after the work
// enqueued so far on its allocation stream), pinned memory at once, as of the
// current host point. Work on other streams that still uses the memory must be
// ordered before that point by the caller; otherwise it is a use-after-free.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;  // releases what *this held
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  bool empty() const { return owner_ == nullptr; }
  // Start address: a device address (for Stream::Copy only) or a host address
  // of pinned memory (readable and writable by the host).
  void* data() const { return data_; }
  int64_t size() const { return size_; }
  MemorySpace space() const { return space_; }
  // The stream device memory was allocated on; nullptr for pinned memory.
  Stream* stream() const { return stream_; }
  // The backend that owns the memory; nullptr when empty.
  Backend* owner() const { return owner_; }

 private:
  friend class Backend;
  Buffer(Backend* owner, void* data, int64_t size, MemorySpace space,
         Stream* stream)
      : owner_(owner), data_(data), size_(size), space_(space),
        stream_(stream) {}
  void Reset();

  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t size_ = 0;
  MemorySpace space_ = MemorySpace::kDevice;
  Stream* stream_ = nullptr;
};

// A point in a stream. Created by Backend::NewEvent, owned by the caller; it
// may be destroyed while the work it captured is still running.
class Event {
 public:
  virtual ~Event() = default;

  // Returns true if the work captured by the most recent Stream::Record of
  // this event has completed, or if the event was never recorded. Never
  // blocks. (In the simulator, device time moves only when the host blocks,
  // so a busy-wait on Query never ends there; use Synchronize.)
  // Errors: kInternal on a device failure.
  virtual StatusOr<bool> Query() = 0;

  // Blocks the host until Query() would return true. Returns at once for an
  // event never recorded. Errors: kInternal on a device failure.
  virtual Status Synchronize() = 0;
};

// A FIFO of asynchronous device work. Owned by its Backend.
class Stream {
 public:
  virtual ~Stream() = default;

  // The name given at creation ("compute" for Backend::ComputeStream()).
  virtual std::string_view name() const = 0;

  // Enqueues a copy of `bytes` bytes from `src` to `dst` and returns without
  // waiting for it. Either side may be device or pinned memory of this
  // backend: device-to-host and host-to-device copies use the copy engine of
  // their direction, so the two directions overlap each other and compute.
  // Addresses inside an allocation are `buffer.data()` plus a byte offset.
  // `bytes == 0` enqueues nothing (the pointers must still be non-null).
  // REQUIRES: both ranges lie inside memory of this backend that is live, and
  //   they do not overlap.
  // Errors: kInvalidArgument if bytes < 0, a pointer is null, or (where the
  //   backend can tell) a range is not inside one allocation of this backend;
  //   kInternal on a device failure.
  virtual Status Copy(void* dst, const void* src, int64_t bytes) = 0;

  // Enqueues a gather of the strided view at `src` into `dst`, densely in
  // row-major order: element (i0, i1, ...) of `shape` is read from
  // src + element_size * sum(ik * strides[k]) (strides in elements, >= 0).
  // This is a kernel on the stream's SMs, not a copy-engine transfer (a
  // tensor's .contiguous()). The default implementation issues one Copy per
  // contiguous run; backends may do better.
  // REQUIRES: as for Copy, for the view's byte extent and for dst.
  // Errors: kInvalidArgument for element_size <= 0, mismatched or negative
  //   shape/strides, null pointers; what Copy returns.
  virtual Status Gather(void* dst, const void* src, int64_t element_size,
                        const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides);

  // Makes `event` capture all work enqueued on this stream so far, replacing
  // what it captured before. REQUIRES: `event` comes from this stream's
  // backend. Errors: kInvalidArgument for a foreign event.
  virtual Status Record(Event& event) = 0;

  // Makes all work enqueued on this stream after this call wait for the work
  // `event` captured at the time of this call. Recording `event` again later
  // does not change what this wait waits for. A never-recorded event: no-op.
  // Does not block the host. Errors: kInvalidArgument for a foreign event.
  virtual Status Wait(const Event& event) = 0;

  // Blocks the host until all work enqueued on this stream so far completed.
  // Errors: kInternal on a device failure.
  virtual Status Synchronize() = 0;
};

// Calls `run(src_byte_offset, dst_byte_offset, bytes)` for each maximal
// contiguous run of the strided view described as in Stream::Gather, in
// row-major order; dst offsets are dense. Nothing for a view of no elements.
// REQUIRES: shape and strides of equal length, sizes and strides >= 0.
void ForEachContiguousRun(
    int64_t element_size, const std::vector<int64_t>& shape,
    const std::vector<int64_t>& strides,
    const std::function<void(int64_t, int64_t, int64_t)>& run);

// The argument checks of Stream::Gather, for implementations.
Status ValidateGather(std::string_view stream, const void* dst,
                      const void* src, int64_t element_size,
                      const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides);

// How a capture treats capture-unsafe calls (cudaStreamCaptureMode): kGlobal
// refuses them from any thread while a global capture runs, kThreadLocal only
// from the capturing thread, kRelaxed never (the caller vouches for them).
// Backends of one host thread (the simulator) treat all three alike.
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

// "global", "thread_local" or "relaxed".
std::string_view CaptureModeName(CaptureMode mode);

// Stream work recorded by Backend::BeginCapture ... EndCapture and not run: a
// cudaGraph_t. Owned by the caller; destroying it does not affect GraphExecs
// instantiated from it.
class Graph {
 public:
  virtual ~Graph() = default;
  // Operations recorded (copies, gathers, kernels, records, waits, memory
  // allocations and frees), for messages and tests.
  virtual int64_t size() const = 0;
};

// A Graph made ready to launch (a cudaGraphExec_t). Owned by the caller; it may
// be destroyed while a launch of it still runs (the launch completes).
class GraphExec {
 public:
  virtual ~GraphExec() = default;
};

// Streams, events and memory of one device.
class Backend {
 public:
  virtual ~Backend() = default;

  // The stream the model's own work runs on (PyTorch's current stream). It
  // lives as long as the backend.
  virtual Stream& ComputeStream() = 0;

  // Creates a stream that lives as long as the backend. `name` shows up in
  // traces and messages; names need not be unique. Errors:
  // kResourceExhausted, kInternal.
  virtual StatusOr<Stream*> NewStream(std::string_view name) = 0;

  // Creates an event that was never recorded. Errors: kInternal.
  virtual StatusOr<std::unique_ptr<Event>> NewEvent() = 0;

  // Allocates `bytes` of device memory, ordered on `stream` (see the ordering
  // rules above). The contents are unspecified.
  // REQUIRES: `stream` comes from this backend.
  // Memory freed on another stream counts as in use until that free has run
  // on the device: right after such a Free (or a dropped Buffer) an
  // allocation on a different stream may fail where one on the freeing
  // stream succeeds.
  // Errors: kInvalidArgument if bytes <= 0 or the stream is foreign;
  //   kResourceExhausted if the device cannot hold `bytes` more.
  virtual StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) = 0;

  // Allocates `bytes` of pinned host memory, usable at once by the host and
  // by any stream. The contents are unspecified.
  // Errors: kInvalidArgument if bytes <= 0; kResourceExhausted if the pinned
  //   capacity cannot hold `bytes` more.
  virtual StatusOr<Buffer> AllocatePinned(int64_t bytes) = 0;

  // Returns `buffer`'s memory (device or pinned), ordered on `stream`: it may
  // be reused by work ordered after everything enqueued on `stream` before
  // this call, and only by such work. Work on other streams that uses the
  // memory must have been ordered before this call (use-after-free otherwise).
  // On success `buffer` is empty; on failure it is untouched.
  // Errors: kInvalidArgument if `buffer` is empty or owned by another backend,
  //   or `stream` is foreign.
  Status Free(Buffer& buffer, Stream& stream);

  // --- Graph capture: an optional capability (CUDA stream capture). ---
  //
  // While a capture runs, work enqueued on a capturing stream is recorded
  // into a graph instead of run, with the same ordering: a stream joins the
  // capture when it Waits on an event recorded on a capturing stream (that is
  // how copy streams enter a capture of the compute stream), and must
  // be joined back (the origin stream Waits on an event recorded after its
  // last captured work) before EndCapture. Device memory allocated on a
  // capturing stream belongs to the graph (CUDA memory nodes): its address is
  // valid for the work of the graph, and each launch allocates and frees it
  // where the capture did. Calls that CUDA refuses during a capture are
  // errors (kFailedPrecondition) that change nothing and leave the capture
  // intact: Synchronize of a capturing stream; Query or Synchronize of an
  // event recorded in the capture; AllocatePinned and pinned frees; a Wait on
  // a capturing stream for an event recorded outside the capture (only
  // in-stream order may cross the capture's boundary); a Wait for, or a
  // Query or Synchronize of, an event whose last record was captured by a
  // capture that has ended (it never ran).

  // Whether this backend implements the calls below. Without it they return
  // kUnimplemented and IsCapturing is false.
  virtual bool SupportsGraphs() const { return false; }

  // Whether `stream` is part of a capture now (its origin or joined).
  virtual bool IsCapturing(const Stream& /*stream*/) const { return false; }

  // Starts capturing on `stream`, its origin.
  // Errors: kUnimplemented; kInvalidArgument if `stream` is foreign;
  //   kFailedPrecondition if `stream` is capturing already.
  virtual Status BeginCapture(Stream& stream, CaptureMode mode);

  // Ends the capture whose origin is `stream` and returns what it recorded.
  // The capture ends even on failure (as in CUDA, where a failed end
  // invalidates the capture): then nothing it recorded runs.
  // Errors: kUnimplemented; kInvalidArgument if `stream` is foreign;
  //   kFailedPrecondition if `stream` is not the origin of a capture, or a
  //   joined stream has captured work the origin does not wait for
  //   ("unjoined").
  virtual StatusOr<std::unique_ptr<Graph>> EndCapture(Stream& stream);

  // Makes `graph` (from this backend's EndCapture) ready to launch.
  // Errors: kUnimplemented; kInvalidArgument for a foreign graph;
  //   kFailedPrecondition if the graph cannot run as recorded (e.g. device
  //   memory allocated in it and never freed in it, on backends that
  //   require it); kInternal on a device failure.
  virtual StatusOr<std::unique_ptr<GraphExec>> Instantiate(const Graph& graph);

  // Enqueues one run of `exec` on `stream`: every operation of the graph
  // runs after the work enqueued on `stream` so far, in the graph's order,
  // and work enqueued on `stream` later runs after all of it. Launches of
  // one exec must not overlap: launch it on one stream (or order launches).
  // Errors: kUnimplemented; kInvalidArgument for a foreign exec or stream;
  //   kFailedPrecondition if `stream` is capturing; kInternal on a device
  //   failure.
  virtual Status Launch(GraphExec& exec, Stream& stream);

  // Whether `stream` (or `event`) was created by this backend: callers check
  // what users hand them before using it (a foreign event is an error at
  // Stream::Wait; the engine reports it at Push instead).
  bool Owns(const Stream& stream) const { return OwnsStream(stream); }
  bool Owns(const Event& event) const { return OwnsEvent(event); }

 protected:
  // For implementations: wraps memory this backend allocated into a handle.
  Buffer MakeBuffer(void* data, int64_t size, MemorySpace space,
                    Stream* stream) {
    return Buffer(this, data, size, space, stream);
  }

  // Returns memory handed out by MakeBuffer. `stream` orders the release as
  // in Free; nullptr means "at once, as of the current host point" (pinned
  // memory dropped by ~Buffer). Called once per allocation.
  // REQUIRES: `stream`, if set, comes from this backend.
  virtual Status Release(void* data, int64_t size, MemorySpace space,
                         Stream* stream) = 0;

  // Whether `stream` was created by this backend (checked by Free).
  virtual bool OwnsStream(const Stream& stream) const = 0;
  // Whether `event` was created by this backend. The default, for backends
  // that cannot tell, accepts every event (a foreign one then fails at
  // Stream::Record or Stream::Wait).
  virtual bool OwnsEvent(const Event& /*event*/) const { return true; }

 private:
  friend class Buffer;
  // ~Buffer's path: reports a failed release to the implementation, which
  // cannot return it to anyone. The default ignores it.
  virtual void OnReleaseFailed(const Status& /*status*/) {}
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_BACKEND_H_
