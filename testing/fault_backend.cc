#include "testing/fault_backend.h"

#include <string>
#include <utility>

namespace offload {

FaultInjectingBackend::FaultInjectingBackend(Backend& inner)
    : BackendWrapper(inner) {}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner)
    : BackendWrapper(std::move(inner)) {}

void FaultInjectingBackend::FailPinnedAllocations(int skip, int count) {
  pinned_ = Fault{skip, count};
}
void FaultInjectingBackend::FailDeviceAllocations(int skip, int count) {
  device_ = Fault{skip, count};
}
void FaultInjectingBackend::FailCopies(int skip, int count) {
  copies_ = Fault{skip, count};
}
void FaultInjectingBackend::FailNewStreams(int skip, int count) {
  streams_ = Fault{skip, count};
}
void FaultInjectingBackend::FailNewEvents(int skip, int count) {
  events_ = Fault{skip, count};
}
void FaultInjectingBackend::FailRecords(int skip, int count) {
  records_ = Fault{skip, count};
}
void FaultInjectingBackend::FailWaits(int skip, int count) {
  waits_ = Fault{skip, count};
}

bool FaultInjectingBackend::Trip(Fault& fault) {
  if (fault.count <= 0) return false;
  if (fault.skip > 0) {
    --fault.skip;
    return false;
  }
  --fault.count;
  ++injected_;
  return true;
}

StatusOr<Stream*> FaultInjectingBackend::NewStream(std::string_view name) {
  if (Trip(streams_)) {
    return ResourceExhaustedError("injected failure: NewStream '" +
                                  std::string(name) + "'");
  }
  return BackendWrapper::NewStream(name);
}

StatusOr<std::unique_ptr<Event>> FaultInjectingBackend::NewEvent() {
  if (Trip(events_)) return InternalError("injected failure: NewEvent");
  return BackendWrapper::NewEvent();
}

StatusOr<Buffer> FaultInjectingBackend::AllocateDevice(int64_t bytes,
                                                       Stream& stream) {
  if (OwnsStream(stream) && Trip(device_)) {
    return ResourceExhaustedError("injected failure: AllocateDevice of " +
                                  std::to_string(bytes) + " B");
  }
  return BackendWrapper::AllocateDevice(bytes, stream);
}

StatusOr<Buffer> FaultInjectingBackend::AllocatePinned(int64_t bytes) {
  if (Trip(pinned_)) {
    return ResourceExhaustedError("injected failure: AllocatePinned of " +
                                  std::to_string(bytes) + " B");
  }
  return BackendWrapper::AllocatePinned(bytes);
}

Status FaultInjectingBackend::StreamCopy(Stream& stream, void* dst,
                                         const void* src, int64_t bytes) {
  if (Trip(copies_)) {
    return InternalError("injected copy failure on stream '" +
                         std::string(stream.name()) + "'");
  }
  return BackendWrapper::StreamCopy(stream, dst, src, bytes);
}

Status FaultInjectingBackend::StreamGather(
    Stream& stream, void* dst, const void* src, int64_t element_size,
    const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (Trip(copies_)) {
    return InternalError("injected gather failure on stream '" +
                         std::string(stream.name()) + "'");
  }
  return BackendWrapper::StreamGather(stream, dst, src, element_size, shape,
                                      strides);
}

Status FaultInjectingBackend::StreamRecord(Stream& stream, Event& event) {
  if (Trip(records_)) {
    return InternalError("injected Record failure on stream '" +
                         std::string(stream.name()) + "'");
  }
  return BackendWrapper::StreamRecord(stream, event);
}

Status FaultInjectingBackend::StreamWait(Stream& stream, const Event& event) {
  if (Trip(waits_)) {
    return InternalError("injected Wait failure on stream '" +
                         std::string(stream.name()) + "'");
  }
  return BackendWrapper::StreamWait(stream, event);
}

}  // namespace offload
