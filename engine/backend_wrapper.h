// BackendWrapper: a Backend that forwards every call to another one (its
// target), as a base for decorators that change or observe a few calls:
// fault injection, timing, capture. A decorator derives from it and
// overrides only what it changes, calling the BackendWrapper version to
// forward.
//
// The wrapper hands out its own streams, events and buffers, each backed by
// one of the target's:
//  - Streams and events are thin objects owned as the Backend interface
//    says (streams by the wrapper, events by the caller). Their calls come
//    back to the wrapper's protected Stream*/Event* hooks, so that one class
//    holds everything a decorator changes. A stream or event of the target
//    (or of another wrapper) passed to the wrapper is foreign.
//  - Buffers belong to the wrapper (Backend::Free checks the owner) and keep
//    the target's handle inside; Free and ~Buffer release the target's.
//    The wrapper hands out the target's addresses unchanged, so copies and
//    gathers pass through without translation.
//
// A failed call changes no state, as for any Backend, as long as the target
// keeps that promise.

#ifndef OFFLOAD_ENGINE_BACKEND_WRAPPER_H_
#define OFFLOAD_ENGINE_BACKEND_WRAPPER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

class BackendWrapper : public Backend {
 public:
  // Forwards to `target`, which must outlive this wrapper.
  explicit BackendWrapper(Backend& target);
  // Forwards to `target` and owns it. REQUIRES: `target` is not null.
  explicit BackendWrapper(std::unique_ptr<Backend> target);
  // Returns the memory of buffers still live to the target. Buffers handed
  // out must not outlive the wrapper.
  ~BackendWrapper() override;

  BackendWrapper(const BackendWrapper&) = delete;
  BackendWrapper& operator=(const BackendWrapper&) = delete;

  // The backend every call goes to.
  Backend& target() { return target_; }

  // The wrapper's stream over the target's compute stream.
  Stream& ComputeStream() override;
  // On success, a new stream of this wrapper over a new stream of the
  // target's; on failure, the target's error and no stream.
  StatusOr<Stream*> NewStream(std::string_view name) override;
  // On success, a new event over a new event of the target's; on failure,
  // the target's error.
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  // On success, a buffer owned by this wrapper with the target's address,
  // allocated on the target stream behind `stream`; its stream() is
  // `stream`. Errors: kInvalidArgument if `stream` is not this wrapper's;
  // what the target returns.
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  // On success, a pinned buffer owned by this wrapper with the target's
  // address. Errors: what the target returns.
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

  // Graph capture forwards to the target with the target's stream behind
  // each of this wrapper's; graphs and execs are the target's own objects,
  // passed through. Errors: kInvalidArgument if a stream is not this
  // wrapper's; what the target returns.
  bool SupportsGraphs() const override { return target_.SupportsGraphs(); }
  bool IsCapturing(const Stream& stream) const override;
  Status BeginCapture(Stream& stream, CaptureMode mode) override;
  StatusOr<std::unique_ptr<Graph>> EndCapture(Stream& stream) override;
  StatusOr<std::unique_ptr<GraphExec>> Instantiate(const Graph& graph) override;
  Status Launch(GraphExec& exec, Stream& stream) override;

 protected:
  // The target's stream behind `stream`; nullptr if `stream` is not one of
  // this wrapper's.
  Stream* TargetStream(const Stream& stream) const;
  // A stream of this wrapper over `target`, a stream of the target's made
  // some other way than NewStream (e.g. over a caller's native stream).
  // REQUIRES: `target` is the target's and outlives this wrapper.
  Stream* AdoptStream(Stream* target);
  // The target's event behind `event`; nullptr if `event` was not made by
  // this wrapper.
  Event* TargetEvent(const Event& event) const;

  // Hooks for the calls made on this wrapper's streams, with the arguments
  // of the Stream method. `stream` is the wrapper's stream the call was made
  // on. A foreign event never reaches a hook: the stream returns
  // kInvalidArgument itself. Each default forwards to the target's stream
  // (and event) and returns its result; an override that fails a call
  // without forwarding it leaves the target untouched.
  // REQUIRES: `stream` and `event` are this wrapper's (as called by its
  //   streams; an override that forwards calls the BackendWrapper version).
  virtual Status StreamCopy(Stream& stream, void* dst, const void* src,
                            int64_t bytes);
  virtual Status StreamGather(Stream& stream, void* dst, const void* src,
                              int64_t element_size,
                              const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& strides);
  virtual Status StreamRecord(Stream& stream, Event& event);
  virtual Status StreamWait(Stream& stream, const Event& event);
  virtual Status StreamSynchronize(Stream& stream);

  // Hooks for the calls made on this wrapper's events; the defaults forward
  // to the target's event and return its result.
  // REQUIRES: `event` is this wrapper's.
  virtual StatusOr<bool> EventQuery(Event& event);
  virtual Status EventSynchronize(Event& event);

  // Releases the target's buffer behind (data, space): with Backend::Free
  // on the target stream behind `stream`, or by dropping the target's
  // handle when `stream` is null. Errors: kInvalidArgument if no live
  // buffer of this wrapper matches or `stream` is not this wrapper's; what
  // the target's Free returns (the buffer stays live then).
  Status Release(void* data, int64_t size, MemorySpace space,
                 Stream* stream) override;
  bool OwnsStream(const Stream& stream) const override;
  bool OwnsEvent(const Event& event) const override;

 private:
  class WrappedStream;
  class WrappedEvent;

  // Keeps the target's handle and returns the wrapper's over it.
  Buffer Adopt(Buffer inner, Stream* stream);

  std::unique_ptr<Backend> owned_;  // before target_: may be what it names
  Backend& target_;
  std::vector<std::unique_ptr<WrappedStream>> streams_;  // [0]: compute
  // The target's handles of live buffers, by address and space.
  std::map<std::pair<void*, MemorySpace>, Buffer> buffers_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_BACKEND_WRAPPER_H_
