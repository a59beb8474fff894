// A conformance suite for implementations of the Backend interface
// (engine/backend.h). Any backend runs it by linking
// //testing:backend_conformance into its test and instantiating the suite:
//
//   INSTANTIATE_TEST_SUITE_P(
//       Sim, BackendConformanceTest,
//       ::testing::Values(BackendFactory{
//           "default", [] { return NewSimBackend(SimOptions{}); }}),
//       BackendFactoryName());
//
// The tests use only the abstract interface and make no timing assumptions:
// the host waits only through Stream::Synchronize and Event::Synchronize, and
// Event::Query is read only after such a wait (or for a never-recorded
// event). So they hold on a real CUDA device and on a simulator whose device
// time moves only while the host blocks. Device addresses are never
// dereferenced; pinned memory is read and written by the host.
//
// What a passing backend guarantees: event semantics (never-recorded events
// are complete, Record/Wait order work across streams, a Wait binds to the
// Record before it, re-recording captures later work), FIFO order within a
// stream, the documented error codes of allocation, Copy and Free (failed
// calls change nothing), stream-ordered reuse of freed device and pinned
// memory, Buffer handle fields, memory returned by destroyed handles, and
// stream naming.
//
// GraphConformanceTest is a second suite, on the same factories, for the
// optional graph capture of engine/backend.h: every test is skipped when
// SupportsGraphs() is false. Instantiate it like the first:
//
//   INSTANTIATE_TEST_SUITE_P(Sim, GraphConformanceTest, ...same values...,
//                            BackendFactoryName());
//
// What a passing backend guarantees: captured work does not run until
// launched; a launch replays it with the bytes of its time (a D2H copy on a
// side stream joined through events, device memory allocated and freed in
// the graph), launch after launch; an unjoined side stream fails EndCapture
// and ends the capture; the calls CUDA refuses during a capture fail with
// kFailedPrecondition and leave it intact; Launch on a capturing stream is
// refused. It checks device bytes only through pinned memory read by the
// host after a synchronization.
//
// Each test needs at most about 64 MiB of device memory and of pinned memory
// at once, so a backend made with small capacities can run the suite; with a
// device capacity below 1 GiB, DestroyedBuffersReturnTheirMemory also proves
// that destroyed handles give their memory back.

#ifndef OFFLOAD_TESTING_BACKEND_CONFORMANCE_H_
#define OFFLOAD_TESTING_BACKEND_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/status.h"
#include "gtest/gtest.h"

namespace offload {

// How the suite gets a backend.
struct BackendFactory {
  // Shown in test names (BackendFactoryName) and in failure output.
  std::string name;
  // Returns a new, independent backend each call (never nullptr). The suite
  // calls it once per test, and once more in tests about foreign objects.
  std::function<std::unique_ptr<Backend>()> make;
  // Optional. Called at the end of every test, after the suite synchronized
  // every stream it used and before the backend is destroyed; a non-OK
  // status fails the test. For checks the interface cannot express, such as
  // a simulator's list of detected hazards.
  std::function<Status(Backend&)> verify = nullptr;
};

// Prints the factory's name (gtest uses it in failure output).
void PrintTo(const BackendFactory& factory, std::ostream* os);

// Test-name generator for INSTANTIATE_TEST_SUITE_P: the factory's name with
// every character other than [A-Za-z0-9] replaced by '_'.
struct BackendFactoryName {
  std::string operator()(
      const ::testing::TestParamInfo<BackendFactory>& info) const;
};

// The fixture of the suite. Each test gets a fresh backend from the factory.
class BackendConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  // Makes the backend; fails the test if the factory returns nullptr.
  void SetUp() override;
  // Synchronizes the compute stream and every stream made with NewStream
  // (each must succeed), then runs the factory's verify hook.
  void TearDown() override;

  Backend& backend() { return *backend_; }
  // Whether SetUp made a backend.
  bool has_backend() const { return backend_ != nullptr; }

  // backend().NewStream(name), remembered so that TearDown synchronizes it.
  StatusOr<Stream*> NewStream(std::string_view name);
  // The streams made with NewStream, in order.
  const std::vector<Stream*>& streams() const { return streams_; }

 private:
  std::unique_ptr<Backend> backend_;
  std::vector<Stream*> streams_;
};

// The fixture of the graph capture suite: a BackendConformanceTest whose
// tests are skipped on backends without SupportsGraphs().
class GraphConformanceTest : public BackendConformanceTest {
 protected:
  // As BackendConformanceTest::SetUp, then GTEST_SKIP without graphs.
  void SetUp() override;
  // Ends a capture a failed test left running (EndCapture on each capturing
  // stream; its result is ignored), then as BackendConformanceTest.
  void TearDown() override;
};

}  // namespace offload

#endif  // OFFLOAD_TESTING_BACKEND_CONFORMANCE_H_
