// Fixture for tests of the fine-grained front door (engine/pipeline_offload.h)
// on the simulator: a fresh SimBackend and PipelineOffloader per Make, groups
// of one fresh 64x64 f32 tensor, pops checked byte for byte.

#ifndef OFFLOAD_TESTING_PIPELINE_TEST_UTIL_H_
#define OFFLOAD_TESTING_PIPELINE_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/pipeline_offload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/byte_pattern.h"
#include "testing/offload_test_util.h"
#include "testing/status_matchers.h"

namespace offload {
namespace pipeline_test {

inline constexpr int64_t kElements = 64 * 64;  // f32: 16 KiB

// Options offloading the groups named `names`.
inline PipelineOffloadOptions Modules(std::vector<std::string> names) {
  PipelineOffloadOptions options;
  options.offload_modules = std::move(names);
  return options;
}

class SimPipelineTest : public ::testing::Test {
 protected:
  // A new simulator and offloader (min_offload_elements 1024).
  void Make(PipelineOffloadOptions options, SimOptions sim_options = {}) {
    off_.reset();  // before the backend it uses
    sim_ = std::make_unique<SimBackend>(sim_options);
    options.min_offload_elements = 1024;
    ASSERT_OK_AND_ASSIGN(off_, PipelineOffloader::Create(*sim_, options));
  }
  // A fresh 64x64 f32 tensor whose storage byte i is PatternByte(i, seed),
  // written on the compute stream by a kernel of `duration_ns`.
  Tensor New(uint64_t seed, int64_t duration_ns = 0) {
    StatusOr<Tensor> t = offload_test::Produce(*sim_, DType::kF32, {64, 64},
                                               seed, duration_ns);
    EXPECT_OK(t.status());
    return t.ok() ? *t : Tensor();
  }
  // One group `name` holding a fresh tensor of `seed`; returns its handle.
  SavedTensor Group(const std::string& name, uint64_t seed,
                    std::vector<Tensor> release = {}) {
    EXPECT_OK(off_->GroupStart(name));
    Tensor t = New(seed);
    StatusOr<SavedTensor> saved = off_->Push(t);
    EXPECT_OK(saved.status());
    EXPECT_OK(off_->GroupCommit(name, release));
    return saved.ok() ? *saved : SavedTensor();
  }
  // Pops, reads it on the compute stream and checks its bytes.
  void PopAndCheck(const SavedTensor& saved, uint64_t seed) {
    ASSERT_OK_AND_ASSIGN(Tensor t, off_->Pop(saved));
    ASSERT_OK(offload_test::Consume(*sim_, {t}, 1000));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                         offload_test::HostBytes(*sim_, t));
    EXPECT_EQ(bytes, PatternBytes(0, kElements * 4, seed)) << "seed " << seed;
  }
  void ExpectClean() {
    sim_->RunUntilIdle();
    EXPECT_THAT(sim_->hazards(), ::testing::IsEmpty());
  }

  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<PipelineOffloader> off_;
};

}  // namespace pipeline_test
}  // namespace offload

#endif  // OFFLOAD_TESTING_PIPELINE_TEST_UTIL_H_
