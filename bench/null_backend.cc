#include "bench/null_backend.h"

#include <string>
#include <utility>

namespace offload {
namespace {

class NullEvent final : public Event {
 public:
  StatusOr<bool> Query() override { return true; }
  Status Synchronize() override { return OkStatus(); }
};

}  // namespace

class NullBackend::NullStream final : public Stream {
 public:
  explicit NullStream(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  Status Copy(void*, const void*, int64_t) override { return OkStatus(); }
  Status Gather(void*, const void*, int64_t, const std::vector<int64_t>&,
                const std::vector<int64_t>&) override {
    return OkStatus();
  }
  Status Record(Event&) override { return OkStatus(); }
  Status Wait(const Event&) override { return OkStatus(); }
  Status Synchronize() override { return OkStatus(); }

 private:
  const std::string name_;
};

NullBackend::NullBackend() {
  streams_.push_back(std::make_unique<NullStream>("compute"));
}

NullBackend::~NullBackend() = default;

Stream& NullBackend::ComputeStream() { return *streams_.front(); }

StatusOr<Stream*> NullBackend::NewStream(std::string_view name) {
  streams_.push_back(std::make_unique<NullStream>(std::string(name)));
  return streams_.back().get();
}

StatusOr<std::unique_ptr<Event>> NullBackend::NewEvent() {
  return std::unique_ptr<Event>(new NullEvent());
}

void* NullBackend::Address(int64_t bytes) {
  void* address = reinterpret_cast<void*>(next_address_);
  next_address_ += (static_cast<uintptr_t>(bytes) + 255) / 256 * 256;
  return address;
}

StatusOr<Buffer> NullBackend::AllocateDevice(int64_t bytes, Stream& stream) {
  if (bytes <= 0 || !OwnsStream(stream)) {
    return InvalidArgumentError("NullBackend::AllocateDevice: bad argument");
  }
  return MakeBuffer(Address(bytes), bytes, MemorySpace::kDevice, &stream);
}

StatusOr<Buffer> NullBackend::AllocatePinned(int64_t bytes) {
  if (bytes <= 0) {
    return InvalidArgumentError("NullBackend::AllocatePinned: bad argument");
  }
  return MakeBuffer(Address(bytes), bytes, MemorySpace::kPinnedHost, nullptr);
}

Status NullBackend::Release(void*, int64_t, MemorySpace, Stream*) {
  return OkStatus();
}

bool NullBackend::OwnsStream(const Stream& stream) const {
  for (const auto& own : streams_) {
    if (own.get() == &stream) return true;
  }
  return false;
}

}  // namespace offload
