#include "engine/status.h"

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace offload {
namespace {

using ::testing::HasSubstr;

TEST(StatusTest, DefaultIsOk) {
  const Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.ToString(), "OK");
  EXPECT_EQ(status, OkStatus());
}

TEST(StatusTest, CodeNames) {
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(StatusCode::kFailedPrecondition),
            "FAILED_PRECONDITION");
  EXPECT_EQ(StatusCodeName(StatusCode::kResourceExhausted),
            "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(StatusCode::kInternal), "INTERNAL");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnavailable), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnimplemented), "UNIMPLEMENTED");
}

struct ErrorCase {
  std::function<Status(std::string)> make;
  StatusCode code;
  std::string to_string;
};

TEST(StatusTest, ErrorHelpersSetCodeMessageAndToString) {
  const ErrorCase cases[] = {
      {InvalidArgumentError, StatusCode::kInvalidArgument,
       "INVALID_ARGUMENT: tensor t1 of layer 2"},
      {FailedPreconditionError, StatusCode::kFailedPrecondition,
       "FAILED_PRECONDITION: tensor t1 of layer 2"},
      {ResourceExhaustedError, StatusCode::kResourceExhausted,
       "RESOURCE_EXHAUSTED: tensor t1 of layer 2"},
      {InternalError, StatusCode::kInternal, "INTERNAL: tensor t1 of layer 2"},
      {UnavailableError, StatusCode::kUnavailable,
       "UNAVAILABLE: tensor t1 of layer 2"},
      {UnimplementedError, StatusCode::kUnimplemented,
       "UNIMPLEMENTED: tensor t1 of layer 2"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.to_string);
    const Status status = c.make("tensor t1 of layer 2");
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(status.code(), c.code);
    EXPECT_EQ(status.message(), "tensor t1 of layer 2");
    EXPECT_EQ(status.ToString(), c.to_string);
    EXPECT_EQ(status, Status(c.code, "tensor t1 of layer 2"));
  }
}

TEST(StatusTest, StreamsToString) {
  std::ostringstream out;
  out << InternalError("copy engine fault") << "|" << OkStatus();
  EXPECT_EQ(out.str(), "INTERNAL: copy engine fault|OK");
}

TEST(StatusTest, WithContextPrefixesTheMessageAndKeepsTheCode) {
  const Status inner = ResourceExhaustedError("pinned pool full");
  const Status outer = inner.WithContext("offloading layer 3");
  EXPECT_EQ(outer.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(outer.message(), "offloading layer 3: pinned pool full");
  EXPECT_EQ(outer.ToString(),
            "RESOURCE_EXHAUSTED: offloading layer 3: pinned pool full");
  // The original is unchanged.
  EXPECT_EQ(inner.message(), "pinned pool full");
  // Contexts nest outermost first.
  EXPECT_EQ(outer.WithContext("forward step 7").message(),
            "forward step 7: offloading layer 3: pinned pool full");
}

TEST(StatusTest, UpdateKeepsTheFirstError) {
  Status status;
  status.Update(OkStatus());
  EXPECT_TRUE(status.ok());
  status.Update(InternalError("first"));
  status.Update(InvalidArgumentError("second"));
  status.Update(OkStatus());
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(status.message(), "first");
}

TEST(StatusTest, WithContextLeavesOkAlone) {
  const Status status = OkStatus().WithContext("layer 3");
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status, OkStatus());
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(InternalError("a"), InternalError("a"));
  EXPECT_NE(InternalError("a"), InternalError("b"));
  EXPECT_NE(InternalError("a"), UnavailableError("a"));
  EXPECT_NE(InternalError(""), OkStatus());
  EXPECT_EQ(OkStatus(), Status());
}

TEST(StatusOrTest, HoldsAValue) {
  StatusOr<int> result = 7;
  ASSERT_TRUE(result.ok());
  EXPECT_OK(result.status());
  EXPECT_EQ(result.value(), 7);
  EXPECT_EQ(*result, 7);
  *result = 8;
  EXPECT_EQ(result.value(), 8);

  StatusOr<std::string> text = std::string("layer");
  ASSERT_OK(text);
  EXPECT_EQ(text->size(), 5u);
}

TEST(StatusOrTest, HoldsAMoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> result = std::make_unique<int>(5);
  ASSERT_OK(result);
  std::unique_ptr<int> taken = std::move(result).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 5);
}

TEST(StatusOrTest, HoldsAnError) {
  const StatusOr<int> result = FailedPreconditionError("not in backward");
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status(), FailedPreconditionError("not in backward"));
  EXPECT_THAT(result,
              StatusIs(StatusCode::kFailedPrecondition, "not in backward"));
}

TEST(StatusOrTest, BuiltFromOkStatusBecomesInternal) {
  const StatusOr<int> result = OkStatus();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(result.status().message().empty());
}

// Reading the value of an error is a bug in the caller; it must stop the
// program with the status in every build, not read an empty optional.
TEST(StatusOrDeathTest, ValueOfAnErrorAbortsWithTheStatus) {
  StatusOr<int> result = InvalidArgumentError("bad shape [4, -1]");
  const StatusOr<int>& const_result = result;
  const char* kMessage = "INVALID_ARGUMENT: bad shape \\[4, -1\\]";
  EXPECT_DEATH((void)result.value(), kMessage);
  EXPECT_DEATH((void)const_result.value(), kMessage);
  EXPECT_DEATH((void)std::move(result).value(), kMessage);
  EXPECT_DEATH((void)*result, kMessage);
  EXPECT_DEATH((void)*const_result, kMessage);
  EXPECT_DEATH((void)*std::move(result), kMessage);

  StatusOr<std::string> text = UnavailableError("no GPU");
  const StatusOr<std::string>& const_text = text;
  EXPECT_DEATH((void)text->size(), "UNAVAILABLE: no GPU");
  EXPECT_DEATH((void)const_text->size(), "UNAVAILABLE: no GPU");
}

TEST(StatusOrDeathTest, ValueOfOneBuiltFromOkAborts) {
  StatusOr<int> result = OkStatus();
  EXPECT_DEATH((void)result.value(), "INTERNAL: StatusOr built from an OK");
}

TEST(StatusOrTest, StatusOfAnRvalueMovesItOut) {
  StatusOr<int> result = InternalError("moved");
  const Status status = std::move(result).status();
  EXPECT_EQ(status, InternalError("moved"));
}

// Helpers for the macro tests: `steps` counts how far a function got.
Status Step(Status result, int& steps) {
  ++steps;
  return result;
}

Status TwoSteps(Status first, int& steps) {
  OFFLOAD_RETURN_IF_ERROR(Step(first, steps));
  OFFLOAD_RETURN_IF_ERROR(Step(OkStatus(), steps));
  return OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesTheFirstError) {
  int steps = 0;
  EXPECT_EQ(TwoSteps(InvalidArgumentError("bad shape"), steps),
            InvalidArgumentError("bad shape"));
  EXPECT_EQ(steps, 1) << "the expression ran once, and nothing after it";
}

TEST(StatusMacrosTest, ReturnIfErrorContinuesOnOk) {
  int steps = 0;
  EXPECT_OK(TwoSteps(OkStatus(), steps));
  EXPECT_EQ(steps, 2);
}

StatusOr<int> Value(StatusOr<int> result, int& calls) {
  ++calls;
  return result;
}

// Doubles the value of `input`, reaching the end only if it held one.
StatusOr<int> Doubled(StatusOr<int> input, int& calls, bool& reached_end) {
  OFFLOAD_ASSIGN_OR_RETURN(const int value, Value(std::move(input), calls));
  reached_end = true;
  return 2 * value;
}

TEST(StatusMacrosTest, AssignOrReturnAssignsTheValue) {
  int calls = 0;
  bool reached_end = false;
  EXPECT_THAT(Doubled(21, calls, reached_end), IsOkAndHolds(42));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(reached_end);
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesTheError) {
  int calls = 0;
  bool reached_end = false;
  EXPECT_THAT(Doubled(UnavailableError("no GPU"), calls, reached_end),
              StatusIs(StatusCode::kUnavailable, "no GPU"));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(reached_end);
}

// Assigns to an existing variable, moves a move-only value, and returns
// into a plain Status.
Status TakeOwnership(StatusOr<std::unique_ptr<int>> input,
                     std::unique_ptr<int>& out) {
  std::unique_ptr<int> taken;
  OFFLOAD_ASSIGN_OR_RETURN(taken, std::move(input));
  out = std::move(taken);
  return OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnWithMoveOnlyValues) {
  std::unique_ptr<int> out;
  EXPECT_OK(TakeOwnership(std::make_unique<int>(3), out));
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(*out, 3);

  std::unique_ptr<int> untouched = std::make_unique<int>(4);
  EXPECT_THAT(TakeOwnership(InternalError("lost"), untouched),
              StatusIs(StatusCode::kInternal, HasSubstr("lost")));
  ASSERT_NE(untouched, nullptr);
  EXPECT_EQ(*untouched, 4);
}

// Two uses in one function must not collide.
StatusOr<int> Sum(StatusOr<int> a, StatusOr<int> b) {
  OFFLOAD_ASSIGN_OR_RETURN(int x, std::move(a));
  OFFLOAD_ASSIGN_OR_RETURN(int y, std::move(b));
  return x + y;
}

TEST(StatusMacrosTest, AssignOrReturnTwiceInOneFunction) {
  EXPECT_THAT(Sum(1, 2), IsOkAndHolds(3));
  EXPECT_THAT(Sum(1, InternalError("second")),
              StatusIs(StatusCode::kInternal, "second"));
  EXPECT_THAT(Sum(InvalidArgumentError("first"), InternalError("second")),
              StatusIs(StatusCode::kInvalidArgument, "first"));
}

}  // namespace
}  // namespace offload
