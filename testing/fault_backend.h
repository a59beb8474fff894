// FaultInjectingBackend: wraps another Backend and makes chosen calls fail,
// for tests of what the engine does when memory runs out, a copy fails or
// an ordering call fails (SPEC §6.7). It is a BackendWrapper: everything it
// does not fail is forwarded unchanged, and its streams, events and buffers
// are the wrapper's (backed by the inner backend's).

#ifndef OFFLOAD_TESTING_FAULT_BACKEND_H_
#define OFFLOAD_TESTING_FAULT_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_wrapper.h"
#include "engine/status.h"

namespace offload {

class FaultInjectingBackend final : public BackendWrapper {
 public:
  // `inner` must outlive this backend and every buffer it hands out.
  explicit FaultInjectingBackend(Backend& inner);
  // Owns `inner`.
  explicit FaultInjectingBackend(std::unique_ptr<Backend> inner);

  // After `skip` more successful calls of the kind, the next `count` calls
  // fail. A failed call does nothing on the inner backend and returns:
  //  - allocations (AllocatePinned, AllocateDevice): kResourceExhausted;
  //  - copies (Stream::Copy and Stream::Gather, one kind): kInternal;
  //  - NewStream: kResourceExhausted; NewEvent: kInternal;
  //  - Stream::Record, Stream::Wait: kInternal.
  // Calls the inner backend would reject as invalid (a foreign stream or
  // event) are neither failed nor counted. Each call replaces the earlier
  // setting of its kind; count 0 turns the kind off.
  void FailPinnedAllocations(int skip, int count = 1);
  void FailDeviceAllocations(int skip, int count = 1);
  void FailCopies(int skip, int count = 1);
  void FailNewStreams(int skip, int count = 1);
  void FailNewEvents(int skip, int count = 1);
  void FailRecords(int skip, int count = 1);
  void FailWaits(int skip, int count = 1);
  // Calls made to fail so far, of all kinds.
  int injected() const { return injected_; }
  Backend& inner() { return target(); }

  StatusOr<Stream*> NewStream(std::string_view name) override;
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

 private:
  struct Fault {
    int skip = 0;
    int count = 0;
  };
  // Whether this call of the kind fails (and counts it).
  bool Trip(Fault& fault);

  Status StreamCopy(Stream& stream, void* dst, const void* src,
                    int64_t bytes) override;
  Status StreamGather(Stream& stream, void* dst, const void* src,
                      int64_t element_size, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) override;
  Status StreamRecord(Stream& stream, Event& event) override;
  Status StreamWait(Stream& stream, const Event& event) override;

  Fault pinned_, device_, copies_, streams_, events_, records_, waits_;
  int injected_ = 0;
};

}  // namespace offload

#endif  // OFFLOAD_TESTING_FAULT_BACKEND_H_
