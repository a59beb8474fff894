// CountingBackend: a BackendWrapper that forwards every call and counts the
// calls of each kind the engine makes (for benchmarks: calls per offloaded
// tensor; for tests: "this path makes no NewEvent in steady state").
//
// A call is counted when it is made, whether it succeeds or not. Free counts
// every release of a buffer: Backend::Free (ordered on a stream) and a
// dropped non-empty Buffer (at once) alike.

#ifndef OFFLOAD_BACKENDS_COUNTING_COUNTING_BACKEND_H_
#define OFFLOAD_BACKENDS_COUNTING_COUNTING_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_wrapper.h"
#include "engine/status.h"

namespace offload {

// Calls made, by kind.
struct CallCounts {
  int64_t new_event = 0;
  int64_t record = 0;
  int64_t wait = 0;
  int64_t copy = 0;    // Stream::Copy
  int64_t gather = 0;  // Stream::Gather
  int64_t allocate_device = 0;
  int64_t allocate_pinned = 0;
  int64_t free = 0;          // Free and dropped buffers
  int64_t synchronize = 0;   // Stream and Event Synchronize
  int64_t query = 0;         // Event::Query

  int64_t total() const;
  CallCounts operator-(const CallCounts& other) const;
  CallCounts& operator+=(const CallCounts& other);
  // "NewEvent", "Record", ...: the kinds in the order of the fields, with
  // their counts; the same order as Names().
  std::vector<int64_t> Values() const;
  static std::vector<std::string> Names();
};

class CountingBackend final : public BackendWrapper {
 public:
  // `inner` must outlive this backend and every buffer it hands out.
  explicit CountingBackend(Backend& inner) : BackendWrapper(inner) {}

  const CallCounts& counts() const { return counts_; }
  void Reset() { counts_ = CallCounts(); }

  StatusOr<std::unique_ptr<Event>> NewEvent() override;
  StatusOr<Buffer> AllocateDevice(int64_t bytes, Stream& stream) override;
  StatusOr<Buffer> AllocatePinned(int64_t bytes) override;

 private:
  Status StreamCopy(Stream& stream, void* dst, const void* src,
                    int64_t bytes) override;
  Status StreamGather(Stream& stream, void* dst, const void* src,
                      int64_t element_size, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) override;
  Status StreamRecord(Stream& stream, Event& event) override;
  Status StreamWait(Stream& stream, const Event& event) override;
  Status StreamSynchronize(Stream& stream) override;
  StatusOr<bool> EventQuery(Event& event) override;
  Status EventSynchronize(Event& event) override;
  Status Release(void* data, int64_t size, MemorySpace space,
                 Stream* stream) override;

  CallCounts counts_;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_COUNTING_COUNTING_BACKEND_H_
