#include "testing/fault_backend.h"

#include <string>
#include <utility>

namespace offload {

class FaultInjectingBackend::FaultStream final : public Stream {
 public:
  FaultStream(FaultInjectingBackend* owner, Stream* inner)
      : owner_(owner), inner_(inner) {}

  std::string_view name() const override { return inner_->name(); }
  Status Copy(void* dst, const void* src, int64_t bytes) override {
    if (owner_->Trip(owner_->copies_)) {
      return InternalError("injected copy failure on stream '" +
                           std::string(name()) + "'");
    }
    return inner_->Copy(dst, src, bytes);
  }
  Status Gather(void* dst, const void* src, int64_t element_size,
                const std::vector<int64_t>& shape,
                const std::vector<int64_t>& strides) override {
    if (owner_->Trip(owner_->copies_)) {
      return InternalError("injected gather failure on stream '" +
                           std::string(name()) + "'");
    }
    return inner_->Gather(dst, src, element_size, shape, strides);
  }
  Status Record(Event& event) override { return inner_->Record(event); }
  Status Wait(const Event& event) override { return inner_->Wait(event); }
  Status Synchronize() override { return inner_->Synchronize(); }

  FaultInjectingBackend* owner_;
  Stream* inner_;
};

FaultInjectingBackend::FaultInjectingBackend(Backend& inner) : inner_(inner) {
  streams_.push_back(
      std::make_unique<FaultStream>(this, &inner_.ComputeStream()));
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner)
    : owned_(std::move(inner)), inner_(*owned_) {
  streams_.push_back(
      std::make_unique<FaultStream>(this, &inner_.ComputeStream()));
}

FaultInjectingBackend::~FaultInjectingBackend() {
  buffers_.clear();  // release into the inner backend while it is alive
}

void FaultInjectingBackend::FailPinnedAllocations(int skip, int count) {
  pinned_ = Fault{skip, count};
}
void FaultInjectingBackend::FailDeviceAllocations(int skip, int count) {
  device_ = Fault{skip, count};
}
void FaultInjectingBackend::FailCopies(int skip, int count) {
  copies_ = Fault{skip, count};
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

Stream* FaultInjectingBackend::Inner(Stream& stream) const {
  for (const auto& wrapper : streams_) {
    if (wrapper.get() == &stream) return wrapper->inner_;
  }
  return nullptr;
}

bool FaultInjectingBackend::OwnsStream(const Stream& stream) const {
  return Inner(const_cast<Stream&>(stream)) != nullptr;
}

Stream& FaultInjectingBackend::ComputeStream() { return *streams_[0]; }

StatusOr<Stream*> FaultInjectingBackend::NewStream(std::string_view name) {
  OFFLOAD_ASSIGN_OR_RETURN(Stream * inner, inner_.NewStream(name));
  streams_.push_back(std::make_unique<FaultStream>(this, inner));
  return static_cast<Stream*>(streams_.back().get());
}

StatusOr<std::unique_ptr<Event>> FaultInjectingBackend::NewEvent() {
  return inner_.NewEvent();
}

StatusOr<Buffer> FaultInjectingBackend::AllocateDevice(int64_t bytes,
                                                       Stream& stream) {
  Stream* inner = Inner(stream);
  if (inner == nullptr) {
    return InvalidArgumentError("AllocateDevice: the stream belongs to "
                                "another backend");
  }
  if (Trip(device_)) {
    return ResourceExhaustedError("injected failure: AllocateDevice of " +
                                  std::to_string(bytes) + " B");
  }
  OFFLOAD_ASSIGN_OR_RETURN(Buffer buffer, inner_.AllocateDevice(bytes, *inner));
  void* data = buffer.data();
  buffers_.emplace(data, std::move(buffer));
  return MakeBuffer(data, bytes, MemorySpace::kDevice, &stream);
}

StatusOr<Buffer> FaultInjectingBackend::AllocatePinned(int64_t bytes) {
  if (Trip(pinned_)) {
    return ResourceExhaustedError("injected failure: AllocatePinned of " +
                                  std::to_string(bytes) + " B");
  }
  OFFLOAD_ASSIGN_OR_RETURN(Buffer buffer, inner_.AllocatePinned(bytes));
  void* data = buffer.data();
  buffers_.emplace(data, std::move(buffer));
  return MakeBuffer(data, bytes, MemorySpace::kPinnedHost, nullptr);
}

Status FaultInjectingBackend::Release(void* data, int64_t size,
                                      MemorySpace space, Stream* stream) {
  auto it = buffers_.find(data);
  if (it == buffers_.end() || it->second.size() != size ||
      it->second.space() != space) {
    return InvalidArgumentError("Free: not a live allocation of this backend");
  }
  if (stream == nullptr) {
    buffers_.erase(it);  // ~Buffer of the inner handle releases it
    return OkStatus();
  }
  Stream* inner = Inner(*stream);
  if (inner == nullptr) {
    return InvalidArgumentError("Free: the stream belongs to another backend");
  }
  OFFLOAD_RETURN_IF_ERROR(inner_.Free(it->second, *inner));
  buffers_.erase(it);
  return OkStatus();
}

}  // namespace offload
