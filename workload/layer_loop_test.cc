#include "workload/layer_loop.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "workload/tensor_util.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kLayers = 3;

std::string CallName(LayerCall call) {
  switch (call) {
    case LayerCall::kForwardStep:
      return "ForwardStep";
    case LayerCall::kBackwardStep:
      return "BackwardStep";
    case LayerCall::kFinishBackward:
      return "FinishBackward";
  }
  return "?";
}

// A stack of kLayers layers with one offloaded, on the simulator; every hook
// appends what it saw to `log`.
class LayerLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OffloadOptions options;
    options.model_layers = kLayers;
    options.offloaded_layers = 1;
    ASSERT_OK_AND_ASSIGN(offloader_, Offloader::Create(*sim_, options));
    saved_.resize(kLayers);
    hooks_.forward = [this](int layer) -> Status {
      log_.push_back("forward " + std::to_string(layer));
      OFFLOAD_ASSIGN_OR_RETURN(
          Tensor t, MakeDeviceTensor(*sim_, DType::kF32, {256 * 1024}, layer));
      OFFLOAD_ASSIGN_OR_RETURN(saved_[layer], offloader_->Push(t));
      return OkStatus();
    };
    hooks_.after_forward = [this]() -> Status {
      log_.push_back("after_forward");
      return OkStatus();
    };
    hooks_.backward = [this](int layer) -> Status {
      log_.push_back("backward " + std::to_string(layer));
      OFFLOAD_ASSIGN_OR_RETURN(Tensor t, offloader_->Pop(saved_[layer]));
      saved_[layer] = SavedTensor();
      return OkStatus();
    };
    hooks_.before_call = [this](LayerCall call, int layer) {
      log_.push_back(CallName(call) + " " + std::to_string(layer));
    };
  }

  void TearDown() override {
    sim_->RunUntilIdle();
    EXPECT_THAT(sim_->hazards(), IsEmpty());
  }

  std::unique_ptr<SimBackend> sim_ = NewSimBackend(SimOptions{});
  std::unique_ptr<Offloader> offloader_;
  std::vector<SavedTensor> saved_;
  LayerLoopHooks hooks_;
  std::vector<std::string> log_;
};

TEST_F(LayerLoopTest, CallsInTrainingOrder) {
  ASSERT_OK(RunLayerStep(*offloader_, kLayers, hooks_));
  EXPECT_THAT(log_,
              ElementsAre("ForwardStep 0", "forward 0", "ForwardStep 1",
                          "forward 1", "ForwardStep 2", "forward 2",
                          "after_forward", "BackwardStep 2", "backward 2",
                          "BackwardStep 1", "backward 1", "BackwardStep 0",
                          "backward 0", "FinishBackward -1"));
  EXPECT_EQ(offloader_->stats().tensors_offloaded, 1);
  // The iteration ended: a second step runs the same way.
  log_.clear();
  ASSERT_OK(RunLayerStep(*offloader_, kLayers, hooks_));
  EXPECT_EQ(log_.size(), 4 * kLayers + 2);
}

TEST_F(LayerLoopTest, PassesRunSeparately) {
  ASSERT_OK(RunForwardPass(*offloader_, kLayers, hooks_));
  EXPECT_THAT(log_, ElementsAre("ForwardStep 0", "forward 0", "ForwardStep 1",
                                "forward 1", "ForwardStep 2", "forward 2"));
  log_.clear();
  ASSERT_OK(RunBackwardPass(*offloader_, kLayers, hooks_));
  EXPECT_THAT(log_,
              ElementsAre("BackwardStep 2", "backward 2", "BackwardStep 1",
                          "backward 1", "BackwardStep 0", "backward 0",
                          "FinishBackward -1"));
}

TEST_F(LayerLoopTest, OptionalHooksMayBeUnset) {
  hooks_.after_forward = nullptr;
  hooks_.before_call = nullptr;
  ASSERT_OK(RunLayerStep(*offloader_, kLayers, hooks_));
  EXPECT_THAT(log_, ElementsAre("forward 0", "forward 1", "forward 2",
                                "backward 2", "backward 1", "backward 0"));
}

TEST_F(LayerLoopTest, TimesEachOffloaderCallOnce) {
  std::vector<std::string> timed;
  hooks_.timed = [&](LayerCall call, int layer,
                     std::chrono::steady_clock::duration took) {
    EXPECT_GE(took.count(), 0);
    timed.push_back(CallName(call) + " " + std::to_string(layer));
  };
  ASSERT_OK(RunLayerStep(*offloader_, kLayers, hooks_));
  EXPECT_THAT(timed,
              ElementsAre("ForwardStep 0", "ForwardStep 1", "ForwardStep 2",
                          "BackwardStep 2", "BackwardStep 1", "BackwardStep 0",
                          "FinishBackward -1"));
}

TEST_F(LayerLoopTest, OffloaderErrorNamesLayerAndCall) {
  // One layer more than the Offloader serves: the extra ForwardStep fails.
  EXPECT_THAT(RunLayerStep(*offloader_, kLayers + 1, hooks_),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("layer 3 ForwardStep: ")));
  EXPECT_EQ(log_.back(), "ForwardStep 3");
}

TEST_F(LayerLoopTest, BackwardStepErrorNamesLayer) {
  // No forward ran in this iteration.
  EXPECT_THAT(RunBackwardPass(*offloader_, kLayers, hooks_),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("layer 2 BackwardStep: ")));
  EXPECT_THAT(log_, ElementsAre("BackwardStep 2"));
}

TEST_F(LayerLoopTest, UnexpectedLayerIdIsInternal) {
  ASSERT_THAT(offloader_->ForwardStep(), IsOkAndHolds(0));
  const Status status = RunLayerStep(*offloader_, kLayers, hooks_);
  EXPECT_THAT(status,
              StatusIs(StatusCode::kInternal,
                       HasSubstr("layer 0 ForwardStep returned layer 1")));
  // No hook ran for the layer.
  EXPECT_THAT(log_, ElementsAre("ForwardStep 0"));
}

TEST_F(LayerLoopTest, ForwardHookErrorStopsTheStep) {
  auto forward = hooks_.forward;
  hooks_.forward = [&](int layer) -> Status {
    if (layer == 1) return ResourceExhaustedError("no room");
    return forward(layer);
  };
  EXPECT_THAT(RunLayerStep(*offloader_, kLayers, hooks_),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("layer 1 forward: no room")));
  EXPECT_THAT(log_, ElementsAre("ForwardStep 0", "forward 0", "ForwardStep 1"));
}

TEST_F(LayerLoopTest, AfterForwardErrorStopsTheStep) {
  hooks_.after_forward = [] { return InvalidArgumentError("bad loss"); };
  EXPECT_THAT(RunLayerStep(*offloader_, kLayers, hooks_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("after forward: bad loss")));
  EXPECT_EQ(log_.back(), "forward 2");
}

TEST_F(LayerLoopTest, BackwardHookErrorStopsTheStep) {
  auto backward = hooks_.backward;
  hooks_.backward = [&](int layer) -> Status {
    OFFLOAD_RETURN_IF_ERROR(backward(layer));
    if (layer == 1) return InternalError("nan");
    return OkStatus();
  };
  EXPECT_THAT(
      RunLayerStep(*offloader_, kLayers, hooks_),
      StatusIs(StatusCode::kInternal, HasSubstr("layer 1 backward: nan")));
  const std::vector<std::string> tail = {"BackwardStep 2", "backward 2",
                                         "BackwardStep 1", "backward 1"};
  ASSERT_GE(log_.size(), tail.size());
  EXPECT_THAT(std::vector<std::string>(log_.end() - tail.size(), log_.end()),
              ElementsAreArray(tail));
}

}  // namespace
}  // namespace offload
