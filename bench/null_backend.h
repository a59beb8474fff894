// NullBackend: a Backend that does no work, for timing the engine alone.
//
// Streams enqueue nothing, events are always complete, and memory is a
// range of made-up addresses that nothing reads or writes (device and
// pinned alike: the engine never touches the bytes it moves). Every call
// succeeds in a few nanoseconds, so a run of the engine against it times
// the engine's own host work, not a backend's.

#ifndef OFFLOAD_BENCH_NULL_BACKEND_H_
#define OFFLOAD_BENCH_NULL_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

class NullBackend final : public Backend {
 public:
  NullBackend();
  ~NullBackend() override;

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
  class NullStream;
  // A made-up address for `bytes` (never reused, never dereferenced).
  void* Address(int64_t bytes);

  std::vector<std::unique_ptr<NullStream>> streams_;  // [0]: compute
  uintptr_t next_address_ = uintptr_t{1} << 40;
};

}  // namespace offload

#endif  // OFFLOAD_BENCH_NULL_BACKEND_H_
