// gMock matchers and gtest macros for Status and StatusOr<T>.
//
//   EXPECT_THAT(backend.AllocatePinned(0),
//               StatusIs(StatusCode::kInvalidArgument));
//   EXPECT_THAT(offloader.Pop(saved),
//               StatusIs(StatusCode::kFailedPrecondition,
//                        HasSubstr("layer 3")));
//   EXPECT_THAT(event->Query(), IsOkAndHolds(true));
//   ASSERT_OK(stream.Synchronize());
//   ASSERT_OK_AND_ASSIGN(Buffer pinned, backend.AllocatePinned(4096));
//
// IsOk() and StatusIs() accept a Status or any StatusOr<T> (the StatusOr's
// status is what is matched); IsOkAndHolds() accepts a StatusOr<T>. When a
// match fails, the output contains the status' ToString(), so the code and the
// message are always visible.

#ifndef OFFLOAD_TESTING_STATUS_MATCHERS_H_
#define OFFLOAD_TESTING_STATUS_MATCHERS_H_

#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {

// Teaches gtest to print a StatusOr<T>: the status' ToString() when it holds
// an error, "OK: " and the value (printed as gtest would) when it holds one.
template <typename T>
void PrintTo(const StatusOr<T>& status_or, std::ostream* os) {
  if (!status_or.ok()) {
    *os << status_or.status().ToString();
    return;
  }
  *os << "OK: " << ::testing::PrintToString(*status_or);
}

namespace status_matchers_internal {

// The status a matcher looks at: the Status itself, or a StatusOr's status.
inline const Status& GetStatus(const Status& status) { return status; }
template <typename T>
const Status& GetStatus(const StatusOr<T>& status_or) {
  return status_or.status();
}

// Implementation of IsOk(). Matches exactly when the status is OK.
class IsOkMatcherImpl {
 public:
  template <typename T>
  bool MatchAndExplain(const T& actual,
                       ::testing::MatchResultListener* listener) const {
    const Status& status = GetStatus(actual);
    *listener << "whose status is " << status.ToString();
    return status.ok();
  }
  void DescribeTo(std::ostream* os) const { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const { *os << "is not OK"; }
};

// Implementation of StatusIs(). Matches when the code is equal and, if a
// message matcher was given, the message matches it.
class StatusIsMatcherImpl {
 public:
  StatusIsMatcherImpl(
      StatusCode code,
      std::optional<::testing::Matcher<const std::string&>> message)
      : code_(code), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& actual,
                       ::testing::MatchResultListener* listener) const {
    const Status& status = GetStatus(actual);
    *listener << "whose status is " << status.ToString();
    if (status.code() != code_) return false;
    if (!message_.has_value()) return true;
    ::testing::StringMatchResultListener message_listener;
    const bool matched =
        message_->MatchAndExplain(status.message(), &message_listener);
    if (!message_listener.str().empty()) {
      *listener << ", and whose message " << message_listener.str();
    }
    return matched;
  }

  void DescribeTo(std::ostream* os) const {
    *os << "has status code " << StatusCodeName(code_);
    if (message_.has_value()) {
      *os << " and a message that ";
      message_->DescribeTo(os);
    }
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status code " << StatusCodeName(code_);
    if (message_.has_value()) {
      *os << " with a message that ";
      message_->DescribeTo(os);
    }
  }

 private:
  StatusCode code_;
  std::optional<::testing::Matcher<const std::string&>> message_;
};

// The T of a StatusOr<T>.
template <typename StatusOrType>
struct StatusOrValue;
template <typename T>
struct StatusOrValue<StatusOr<T>> {
  using type = T;
};

// Implementation of IsOkAndHolds() for one StatusOr type: matches when the
// StatusOr holds a value and the value matches the inner matcher.
template <typename StatusOrType>
class IsOkAndHoldsMatcherImpl
    : public ::testing::MatcherInterface<const StatusOrType&> {
 public:
  using ValueType = typename StatusOrValue<StatusOrType>::type;

  explicit IsOkAndHoldsMatcherImpl(::testing::Matcher<const ValueType&> inner)
      : inner_(std::move(inner)) {}

  bool MatchAndExplain(
      const StatusOrType& actual,
      ::testing::MatchResultListener* listener) const override {
    if (!actual.ok()) {
      *listener << "whose status is " << actual.status().ToString();
      return false;
    }
    ::testing::StringMatchResultListener inner_listener;
    const bool matched = inner_.MatchAndExplain(*actual, &inner_listener);
    *listener << "which holds " << ::testing::PrintToString(*actual);
    if (!inner_listener.str().empty())
      *listener << ", " << inner_listener.str();
    return matched;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "is OK and holds a value that ";
    inner_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "is not OK, or holds a value that ";
    inner_.DescribeNegationTo(os);
  }

 private:
  ::testing::Matcher<const ValueType&> inner_;
};

// What IsOkAndHolds() returns: becomes an IsOkAndHoldsMatcherImpl for
// whichever StatusOr type it is matched against.
template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}

  template <typename StatusOrRef>
  operator ::testing::Matcher<StatusOrRef>() const {  // NOLINT: implicit
    using StatusOrType = std::remove_cvref_t<StatusOrRef>;
    using ValueType = typename StatusOrValue<StatusOrType>::type;
    return ::testing::Matcher<StatusOrRef>(
        new IsOkAndHoldsMatcherImpl<StatusOrType>(
            ::testing::SafeMatcherCast<const ValueType&>(inner_)));
  }

 private:
  InnerMatcher inner_;
};

}  // namespace status_matchers_internal

// Matches an OK Status, or a StatusOr<T> that holds a value.
inline ::testing::PolymorphicMatcher<status_matchers_internal::IsOkMatcherImpl>
IsOk() {
  return ::testing::MakePolymorphicMatcher(
      status_matchers_internal::IsOkMatcherImpl());
}

// Matches a Status (or a StatusOr's status) whose code is `code`, whatever
// its message.
inline ::testing::PolymorphicMatcher<
    status_matchers_internal::StatusIsMatcherImpl>
StatusIs(StatusCode code) {
  return ::testing::MakePolymorphicMatcher(
      status_matchers_internal::StatusIsMatcherImpl(code, std::nullopt));
}

// Matches a Status (or a StatusOr's status) whose code is `code` and whose
// message matches `message_matcher`: a gMock string matcher such as
// HasSubstr("layer 3"), or a string, which must equal the message.
template <typename MessageMatcher>
::testing::PolymorphicMatcher<status_matchers_internal::StatusIsMatcherImpl>
StatusIs(StatusCode code, MessageMatcher&& message_matcher) {
  return ::testing::MakePolymorphicMatcher(
      status_matchers_internal::StatusIsMatcherImpl(
          code, ::testing::MatcherCast<const std::string&>(
                    std::forward<MessageMatcher>(message_matcher))));
}

// Matches a StatusOr<T> that holds a value matching `value_matcher` (a
// matcher of T, or a value of T to compare with ==).
template <typename InnerMatcher>
status_matchers_internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>>
IsOkAndHolds(InnerMatcher&& value_matcher) {
  return status_matchers_internal::IsOkAndHoldsMatcher<
      std::decay_t<InnerMatcher>>(std::forward<InnerMatcher>(value_matcher));
}

}  // namespace offload

// Non-fatal / fatal check that `expr` (a Status or a StatusOr) is OK. On
// failure the status' ToString() is printed.
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::offload::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::offload::IsOk())

// Evaluates `expr` (a StatusOr) once. If it holds an error, fails the test
// fatally (returning from the current function, which must return void) and
// prints the expression and the status' ToString(); otherwise move-assigns
// the value to `lhs`, which may be a declaration (`auto x`, `Buffer b`).
// Expands to several statements: do not use it as the body of an unbraced
// if/for/while.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  OFFLOAD_ASSERT_OK_AND_ASSIGN_IMPL_(   \
      OFFLOAD_STATUS_CONCAT_(offload_assert_statusor_, __LINE__), lhs, expr)
#define OFFLOAD_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)            \
  auto tmp = (expr);                                                  \
  if (!tmp.ok()) {                                                    \
    GTEST_FAIL() << #expr << " returned " << tmp.status().ToString(); \
  }                                                                   \
  lhs = std::move(tmp).value()

#endif  // OFFLOAD_TESTING_STATUS_MATCHERS_H_
