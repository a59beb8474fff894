#include "testing/status_matchers.h"

#include <memory>
#include <string>

#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using ::testing::DescribeMatcher;
using ::testing::Eq;
using ::testing::Gt;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointee;

// What `matcher` says about `value` when explaining a (mis)match.
template <typename Matcher, typename T>
std::string Explain(const Matcher& matcher, const T& value) {
  ::testing::StringMatchResultListener listener;
  ::testing::ExplainMatchResult(matcher, value, &listener);
  return listener.str();
}

TEST(IsOkTest, MatchesOkStatusAndStatusOrWithValue) {
  EXPECT_THAT(OkStatus(), IsOk());
  EXPECT_THAT(StatusOr<int>(3), IsOk());
  EXPECT_THAT(InternalError("boom"), Not(IsOk()));
  EXPECT_THAT(StatusOr<int>(InvalidArgumentError("bad")), Not(IsOk()));
}

TEST(IsOkTest, ExplainsWithToString) {
  EXPECT_THAT(Explain(IsOk(), InternalError("boom in layer 3")),
              HasSubstr("INTERNAL: boom in layer 3"));
  EXPECT_THAT(Explain(IsOk(), StatusOr<int>(UnavailableError("no device"))),
              HasSubstr("UNAVAILABLE: no device"));
  EXPECT_EQ(DescribeMatcher<Status>(IsOk()), "is OK");
  EXPECT_EQ(DescribeMatcher<Status>(IsOk(), /*negation=*/true), "is not OK");
}

TEST(StatusIsTest, MatchesCode) {
  EXPECT_THAT(InvalidArgumentError("x"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(InvalidArgumentError("x"), Not(StatusIs(StatusCode::kInternal)));
  EXPECT_THAT(OkStatus(), StatusIs(StatusCode::kOk));
  EXPECT_THAT(StatusOr<int>(7), StatusIs(StatusCode::kOk));
  EXPECT_THAT(StatusOr<int>(ResourceExhaustedError("full")),
              StatusIs(StatusCode::kResourceExhausted));
}

TEST(StatusIsTest, MatchesCodeAndMessage) {
  const Status status = FailedPreconditionError("layer 3 is not offloaded yet");
  EXPECT_THAT(status,
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 3")));
  EXPECT_THAT(status, StatusIs(StatusCode::kFailedPrecondition,
                               "layer 3 is not offloaded yet"));
  EXPECT_THAT(status, Not(StatusIs(StatusCode::kFailedPrecondition,
                                   HasSubstr("layer 4"))));
  EXPECT_THAT(status,
              Not(StatusIs(StatusCode::kInternal, HasSubstr("layer 3"))));
  EXPECT_THAT(StatusOr<int>(status),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("layer 3")));
}

TEST(StatusIsTest, DescribesAndExplains) {
  EXPECT_EQ(DescribeMatcher<Status>(StatusIs(StatusCode::kInvalidArgument)),
            "has status code INVALID_ARGUMENT");
  EXPECT_THAT(DescribeMatcher<Status>(
                  StatusIs(StatusCode::kInvalidArgument, HasSubstr("abc"))),
              HasSubstr("has status code INVALID_ARGUMENT and a message that "
                        "has substring \"abc\""));
  EXPECT_THAT(Explain(StatusIs(StatusCode::kInvalidArgument),
                      InternalError("device lost")),
              HasSubstr("INTERNAL: device lost"));
}

TEST(IsOkAndHoldsTest, MatchesValue) {
  EXPECT_THAT(StatusOr<int>(5), IsOkAndHolds(5));
  EXPECT_THAT(StatusOr<int>(5), IsOkAndHolds(Gt(4)));
  EXPECT_THAT(StatusOr<int>(5), Not(IsOkAndHolds(6)));
  EXPECT_THAT(StatusOr<int>(InternalError("x")), Not(IsOkAndHolds(5)));
  EXPECT_THAT(StatusOr<bool>(true), IsOkAndHolds(true));
  StatusOr<std::unique_ptr<int>> pointer(std::make_unique<int>(9));
  EXPECT_THAT(pointer, IsOkAndHolds(Pointee(Eq(9))));
}

TEST(IsOkAndHoldsTest, ExplainsWithToString) {
  EXPECT_THAT(Explain(IsOkAndHolds(1), StatusOr<int>(InternalError("bad"))),
              HasSubstr("INTERNAL: bad"));
  EXPECT_THAT(Explain(IsOkAndHolds(1), StatusOr<int>(2)),
              HasSubstr("which holds 2"));
}

TEST(PrintToTest, PrintsStatusOr) {
  EXPECT_EQ(::testing::PrintToString(StatusOr<int>(5)), "OK: 5");
  EXPECT_EQ(::testing::PrintToString(StatusOr<int>(InvalidArgumentError("n"))),
            "INVALID_ARGUMENT: n");
  EXPECT_EQ(::testing::PrintToString(InternalError("m")), "INTERNAL: m");
}

TEST(MacroTest, ExpectOkReportsToString) {
  EXPECT_OK(OkStatus());
  EXPECT_OK(StatusOr<int>(1));
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(InternalError("boom in tensor t7")),
                          "INTERNAL: boom in tensor t7");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_OK(StatusOr<int>(ResourceExhaustedError("pool full"))),
      "RESOURCE_EXHAUSTED: pool full");
}

void AssertOkOnError() {
  ASSERT_OK(UnavailableError("no device"));
  ADD_FAILURE() << "ASSERT_OK did not return";
}

TEST(MacroTest, AssertOkIsFatal) {
  ASSERT_OK(OkStatus());
  EXPECT_FATAL_FAILURE(AssertOkOnError(), "UNAVAILABLE: no device");
}

StatusOr<int> FortyTwo() { return 42; }
StatusOr<int> Broken() { return InternalError("broken on purpose"); }

void AssignFromError() {
  ASSERT_OK_AND_ASSIGN(int value, Broken());
  ADD_FAILURE() << "ASSERT_OK_AND_ASSIGN did not return; got " << value;
}

TEST(MacroTest, AssertOkAndAssign) {
  ASSERT_OK_AND_ASSIGN(int value, FortyTwo());
  EXPECT_EQ(value, 42);

  int existing = 0;
  ASSERT_OK_AND_ASSIGN(existing, FortyTwo());
  EXPECT_EQ(existing, 42);

  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<int> moved,
      StatusOr<std::unique_ptr<int>>(std::make_unique<int>(3)));
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(*moved, 3);

  EXPECT_FATAL_FAILURE(AssignFromError(), "INTERNAL: broken on purpose");
  EXPECT_FATAL_FAILURE(AssignFromError(), "Broken()");
}

}  // namespace
}  // namespace offload
