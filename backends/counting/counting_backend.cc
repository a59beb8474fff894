#include "backends/counting/counting_backend.h"

namespace offload {

int64_t CallCounts::total() const {
  int64_t sum = 0;
  for (int64_t value : Values()) sum += value;
  return sum;
}

CallCounts CallCounts::operator-(const CallCounts& o) const {
  CallCounts d;
  d.new_event = new_event - o.new_event;
  d.record = record - o.record;
  d.wait = wait - o.wait;
  d.copy = copy - o.copy;
  d.gather = gather - o.gather;
  d.allocate_device = allocate_device - o.allocate_device;
  d.allocate_pinned = allocate_pinned - o.allocate_pinned;
  d.free = free - o.free;
  d.synchronize = synchronize - o.synchronize;
  d.query = query - o.query;
  return d;
}

CallCounts& CallCounts::operator+=(const CallCounts& o) {
  new_event += o.new_event;
  record += o.record;
  wait += o.wait;
  copy += o.copy;
  gather += o.gather;
  allocate_device += o.allocate_device;
  allocate_pinned += o.allocate_pinned;
  free += o.free;
  synchronize += o.synchronize;
  query += o.query;
  return *this;
}

std::vector<int64_t> CallCounts::Values() const {
  return {new_event,       record,          wait, copy,        gather,
          allocate_device, allocate_pinned, free, synchronize, query};
}

std::vector<std::string> CallCounts::Names() {
  return {"NewEvent",       "Record",         "Wait", "Copy",        "Gather",
          "AllocateDevice", "AllocatePinned", "Free", "Synchronize", "Query"};
}

StatusOr<std::unique_ptr<Event>> CountingBackend::NewEvent() {
  ++counts_.new_event;
  return BackendWrapper::NewEvent();
}

StatusOr<Buffer> CountingBackend::AllocateDevice(int64_t bytes,
                                                 Stream& stream) {
  ++counts_.allocate_device;
  return BackendWrapper::AllocateDevice(bytes, stream);
}

StatusOr<Buffer> CountingBackend::AllocatePinned(int64_t bytes) {
  ++counts_.allocate_pinned;
  return BackendWrapper::AllocatePinned(bytes);
}

Status CountingBackend::StreamCopy(Stream& stream, void* dst, const void* src,
                                   int64_t bytes) {
  ++counts_.copy;
  return BackendWrapper::StreamCopy(stream, dst, src, bytes);
}

Status CountingBackend::StreamGather(Stream& stream, void* dst,
                                     const void* src, int64_t element_size,
                                     const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& strides) {
  ++counts_.gather;
  return BackendWrapper::StreamGather(stream, dst, src, element_size, shape,
                                      strides);
}

Status CountingBackend::StreamRecord(Stream& stream, Event& event) {
  ++counts_.record;
  return BackendWrapper::StreamRecord(stream, event);
}

Status CountingBackend::StreamWait(Stream& stream, const Event& event) {
  ++counts_.wait;
  return BackendWrapper::StreamWait(stream, event);
}

Status CountingBackend::StreamSynchronize(Stream& stream) {
  ++counts_.synchronize;
  return BackendWrapper::StreamSynchronize(stream);
}

StatusOr<bool> CountingBackend::EventQuery(Event& event) {
  ++counts_.query;
  return BackendWrapper::EventQuery(event);
}

Status CountingBackend::EventSynchronize(Event& event) {
  ++counts_.synchronize;
  return BackendWrapper::EventSynchronize(event);
}

Status CountingBackend::Release(void* data, int64_t size, MemorySpace space,
                                Stream* stream) {
  ++counts_.free;
  return BackendWrapper::Release(data, size, space, stream);
}

}  // namespace offload
