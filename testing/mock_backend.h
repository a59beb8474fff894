// gMock mocks of the device interface in engine/backend.h.
//
// Every virtual method of Backend, Stream and Event is mocked, including the
// Backend hooks an implementation overrides (Release, OwnsStream,
// OnReleaseFailed); the mocks declare them public so tests can set
// expectations on them. MockBackend::MakeBufferForTest wraps any address into
// a Buffer owned by the mock, so tests can drive Buffer and Backend::Free
// without real memory: destroying such a Buffer calls the mock's Release.
//
// Unconfigured methods returning Status return OK; those returning a
// StatusOr, a reference or a value without a default abort when called, so a
// test must give them an action. Every Buffer made by a MockBackend must be
// destroyed before the MockBackend (declare the backend first).

#ifndef OFFLOAD_TESTING_MOCK_BACKEND_H_
#define OFFLOAD_TESTING_MOCK_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "engine/backend.h"
#include "engine/status.h"
#include "gmock/gmock.h"

namespace offload {

class MockEvent : public Event {
 public:
  MOCK_METHOD(StatusOr<bool>, Query, (), (override));
  MOCK_METHOD(Status, Synchronize, (), (override));
};

class MockStream : public Stream {
 public:
  MockStream() = default;
  // name() answers `name` unless a test gives it another action.
  explicit MockStream(std::string name) : name_(std::move(name)) {
    ON_CALL(*this, name())
        .WillByDefault(::testing::Return(std::string_view(name_)));
  }

  MOCK_METHOD(std::string_view, name, (), (const, override));
  MOCK_METHOD(Status, Copy, (void* dst, const void* src, int64_t bytes),
              (override));
  MOCK_METHOD(Status, Record, (Event & event), (override));
  MOCK_METHOD(Status, Wait, (const Event& event), (override));
  MOCK_METHOD(Status, Synchronize, (), (override));

 private:
  std::string name_;
};

class MockBackend : public Backend {
 public:
  MOCK_METHOD(Stream&, ComputeStream, (), (override));
  MOCK_METHOD(StatusOr<Stream*>, NewStream, (std::string_view name),
              (override));
  MOCK_METHOD(StatusOr<std::unique_ptr<Event>>, NewEvent, (), (override));
  MOCK_METHOD(StatusOr<Buffer>, AllocateDevice, (int64_t bytes, Stream& stream),
              (override));
  MOCK_METHOD(StatusOr<Buffer>, AllocatePinned, (int64_t bytes), (override));

  // Protected in Backend; public here so tests can expect calls.
  MOCK_METHOD(Status, Release,
              (void* data, int64_t size, MemorySpace space, Stream* stream),
              (override));
  MOCK_METHOD(bool, OwnsStream, (const Stream& stream), (const, override));
  // Private in Backend (called by ~Buffer when Release fails); public here.
  MOCK_METHOD(void, OnReleaseFailed, (const Status& status), (override));

  // A Buffer owned by this mock describing [data, data + size) in `space`,
  // allocated on `stream` (nullptr for pinned memory). Nothing is allocated:
  // `data` may be any address, including one that is never dereferenced.
  Buffer MakeBufferForTest(void* data, int64_t size, MemorySpace space,
                           Stream* stream) {
    return MakeBuffer(data, size, space, stream);
  }
};

}  // namespace offload

#endif  // OFFLOAD_TESTING_MOCK_BACKEND_H_
