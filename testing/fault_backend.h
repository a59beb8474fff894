// FaultInjectingBackend: wraps another Backend and makes chosen calls fail,
// for tests of what the engine does when memory runs out or a copy fails
// (SPEC §6.7). Everything else is forwarded unchanged: streams are wrappers
// of the inner streams, events are the inner backend's, and buffers are
// re-wrapped so that they belong to this backend (Free and ~Buffer forward
// to the inner buffer).

#ifndef OFFLOAD_TESTING_FAULT_BACKEND_H_
#define OFFLOAD_TESTING_FAULT_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

class FaultInjectingBackend final : public Backend {
 public:
  // `inner` must outlive this backend and every buffer it hands out.
  explicit FaultInjectingBackend(Backend& inner);
  // Owns `inner`.
  explicit FaultInjectingBackend(std::unique_ptr<Backend> inner);
  ~FaultInjectingBackend() override;

  // After `skip` more successful calls of the kind, the next `count` calls
  // fail: allocations with kResourceExhausted, copies (Copy and Gather) with
  // kInternal. A failed call does nothing on the inner backend.
  void FailPinnedAllocations(int skip, int count = 1);
  void FailDeviceAllocations(int skip, int count = 1);
  void FailCopies(int skip, int count = 1);
  // Calls made to fail so far.
  int injected() const { return injected_; }
  Backend& inner() { return inner_; }

  Stream& ComputeStream() override;
  StatusOr<Stream*> NewStream(std::string_view name) override;
  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

 protected:
  Status Release(void* data, int64_t size, MemorySpace space,
                 Stream* stream) override;
  bool OwnsStream(const Stream& stream) const override;

 private:
  class FaultStream;
  struct Fault {
    int skip = 0;
    int count = 0;
  };
  // Whether this call of the kind fails (and counts it).
  bool Trip(Fault& fault);
  Stream* Inner(Stream& stream) const;

  std::unique_ptr<Backend> owned_;  // before inner_: may be what it refers to
  Backend& inner_;
  std::vector<std::unique_ptr<FaultStream>> streams_;
  std::map<void*, Buffer> buffers_;  // inner handles by address
  Fault pinned_, device_, copies_;
  int injected_ = 0;
};

}  // namespace offload

#endif  // OFFLOAD_TESTING_FAULT_BACKEND_H_
