#include "engine/backend_wrapper.h"

#include <string>
#include <utility>

namespace offload {

// A stream of the wrapper: names the target's stream, sends every call to
// the wrapper's hooks.
class BackendWrapper::WrappedStream final : public Stream {
 public:
  WrappedStream(BackendWrapper* owner, Stream* target)
      : owner_(owner), target_(target) {}

  std::string_view name() const override { return target_->name(); }
  Status Copy(void* dst, const void* src, int64_t bytes) override {
    return owner_->StreamCopy(*this, dst, src, bytes);
  }
  Status Gather(void* dst, const void* src, int64_t element_size,
                const std::vector<int64_t>& shape,
                const std::vector<int64_t>& strides) override {
    return owner_->StreamGather(*this, dst, src, element_size, shape,
                                strides);
  }
  Status Record(Event& event) override {
    if (owner_->TargetEvent(event) == nullptr) return Foreign("Record");
    return owner_->StreamRecord(*this, event);
  }
  Status Wait(const Event& event) override {
    if (owner_->TargetEvent(event) == nullptr) return Foreign("Wait");
    return owner_->StreamWait(*this, event);
  }
  Status Synchronize() override { return owner_->StreamSynchronize(*this); }

  BackendWrapper* owner() const { return owner_; }
  Stream* target() const { return target_; }

 private:
  Status Foreign(std::string_view call) const {
    return InvalidArgumentError(std::string(call) + " on stream '" +
                                std::string(name()) +
                                "': the event belongs to another backend");
  }

  BackendWrapper* owner_;
  Stream* target_;
};

// An event of the wrapper: owns the target's event, sends calls to the
// wrapper's hooks.
class BackendWrapper::WrappedEvent final : public Event {
 public:
  WrappedEvent(BackendWrapper* owner, std::unique_ptr<Event> target)
      : owner_(owner), target_(std::move(target)) {}

  StatusOr<bool> Query() override { return owner_->EventQuery(*this); }
  Status Synchronize() override { return owner_->EventSynchronize(*this); }

  BackendWrapper* owner() const { return owner_; }
  Event* target() const { return target_.get(); }

 private:
  BackendWrapper* owner_;
  std::unique_ptr<Event> target_;
};

BackendWrapper::BackendWrapper(Backend& target) : target_(target) {
  streams_.push_back(
      std::make_unique<WrappedStream>(this, &target_.ComputeStream()));
}

BackendWrapper::BackendWrapper(std::unique_ptr<Backend> target)
    : owned_(std::move(target)), target_(*owned_) {
  streams_.push_back(
      std::make_unique<WrappedStream>(this, &target_.ComputeStream()));
}

BackendWrapper::~BackendWrapper() {
  buffers_.clear();  // into the target while it is alive
}

Stream* BackendWrapper::TargetStream(const Stream& stream) const {
  const auto* wrapped = dynamic_cast<const WrappedStream*>(&stream);
  if (wrapped == nullptr || wrapped->owner() != this) return nullptr;
  return wrapped->target();
}

Event* BackendWrapper::TargetEvent(const Event& event) const {
  const auto* wrapped = dynamic_cast<const WrappedEvent*>(&event);
  if (wrapped == nullptr || wrapped->owner() != this) return nullptr;
  return wrapped->target();
}

bool BackendWrapper::OwnsEvent(const Event& event) const {
  return TargetEvent(event) != nullptr;
}

bool BackendWrapper::OwnsStream(const Stream& stream) const {
  return TargetStream(stream) != nullptr;
}

Stream& BackendWrapper::ComputeStream() { return *streams_[0]; }

StatusOr<Stream*> BackendWrapper::NewStream(std::string_view name) {
  OFFLOAD_ASSIGN_OR_RETURN(Stream * target, target_.NewStream(name));
  return AdoptStream(target);
}

Stream* BackendWrapper::AdoptStream(Stream* target) {
  streams_.push_back(std::make_unique<WrappedStream>(this, target));
  return streams_.back().get();
}

StatusOr<std::unique_ptr<Event>> BackendWrapper::NewEvent() {
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Event> target, target_.NewEvent());
  return std::unique_ptr<Event>(
      std::make_unique<WrappedEvent>(this, std::move(target)));
}

Buffer BackendWrapper::Adopt(Buffer inner, Stream* stream) {
  void* data = inner.data();
  const int64_t size = inner.size();
  const MemorySpace space = inner.space();
  buffers_.insert_or_assign({data, space}, std::move(inner));
  return MakeBuffer(data, size, space, stream);
}

StatusOr<Buffer> BackendWrapper::AllocateDevice(int64_t bytes,
                                                Stream& stream) {
  Stream* target = TargetStream(stream);
  if (target == nullptr) {
    return InvalidArgumentError("AllocateDevice: stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  OFFLOAD_ASSIGN_OR_RETURN(Buffer inner, target_.AllocateDevice(bytes, *target));
  return Adopt(std::move(inner), &stream);
}

StatusOr<Buffer> BackendWrapper::AllocatePinned(int64_t bytes) {
  OFFLOAD_ASSIGN_OR_RETURN(Buffer inner, target_.AllocatePinned(bytes));
  return Adopt(std::move(inner), nullptr);
}

Status BackendWrapper::Release(void* data, int64_t size, MemorySpace space,
                               Stream* stream) {
  auto it = buffers_.find({data, space});
  if (it == buffers_.end() || it->second.size() != size) {
    return InvalidArgumentError("Free: not a live allocation of this backend");
  }
  if (stream == nullptr) {
    buffers_.erase(it);  // the target's handle releases at once
    return OkStatus();
  }
  Stream* target = TargetStream(*stream);
  if (target == nullptr) {
    return InvalidArgumentError("Free: stream '" +
                                std::string(stream->name()) +
                                "' belongs to another backend");
  }
  OFFLOAD_RETURN_IF_ERROR(target_.Free(it->second, *target));
  buffers_.erase(it);
  return OkStatus();
}

Status BackendWrapper::StreamCopy(Stream& stream, void* dst, const void* src,
                                  int64_t bytes) {
  return TargetStream(stream)->Copy(dst, src, bytes);
}

Status BackendWrapper::StreamGather(Stream& stream, void* dst,
                                    const void* src, int64_t element_size,
                                    const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& strides) {
  return TargetStream(stream)->Gather(dst, src, element_size, shape, strides);
}

Status BackendWrapper::StreamRecord(Stream& stream, Event& event) {
  return TargetStream(stream)->Record(*TargetEvent(event));
}

Status BackendWrapper::StreamWait(Stream& stream, const Event& event) {
  return TargetStream(stream)->Wait(*TargetEvent(event));
}

Status BackendWrapper::StreamSynchronize(Stream& stream) {
  return TargetStream(stream)->Synchronize();
}

StatusOr<bool> BackendWrapper::EventQuery(Event& event) {
  return TargetEvent(event)->Query();
}

Status BackendWrapper::EventSynchronize(Event& event) {
  return TargetEvent(event)->Synchronize();
}

bool BackendWrapper::IsCapturing(const Stream& stream) const {
  Stream* target = TargetStream(stream);
  return target != nullptr && target_.IsCapturing(*target);
}

Status BackendWrapper::BeginCapture(Stream& stream, CaptureMode mode) {
  Stream* target = TargetStream(stream);
  if (target == nullptr) {
    return InvalidArgumentError(
        "BeginCapture: the stream belongs to another backend");
  }
  return target_.BeginCapture(*target, mode);
}

StatusOr<std::unique_ptr<Graph>> BackendWrapper::EndCapture(Stream& stream) {
  Stream* target = TargetStream(stream);
  if (target == nullptr) {
    return InvalidArgumentError(
        "EndCapture: the stream belongs to another backend");
  }
  return target_.EndCapture(*target);
}

StatusOr<std::unique_ptr<GraphExec>> BackendWrapper::Instantiate(
    const Graph& graph) {
  return target_.Instantiate(graph);
}

Status BackendWrapper::Launch(GraphExec& exec, Stream& stream) {
  Stream* target = TargetStream(stream);
  if (target == nullptr) {
    return InvalidArgumentError("Launch: the stream belongs to another backend");
  }
  return target_.Launch(exec, *target);
}

}  // namespace offload
