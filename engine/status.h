// Status and StatusOr<T>: how every fallible call in this project reports
// failure. Value types; no exceptions cross the API.
//
// A Status is either OK or a code plus a message. Messages name what was
// involved (layer or group, tensor, state) so that a failure can be read
// without a debugger.

#ifndef OFFLOAD_ENGINE_STATUS_H_
#define OFFLOAD_ENGINE_STATUS_H_

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace offload {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed
  kFailedPrecondition,  // the call is not allowed in the current state
  kResourceExhausted,   // out of device or pinned memory
  kInternal,            // a broken invariant or a backend failure
  kUnavailable,         // the backend cannot serve the call (no device)
  kUnimplemented,       // the backend lacks an optional capability
};

// "OK", "INVALID_ARGUMENT", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  // REQUIRES: code != kOk (an OK status carries no message; use Status()).
  Status(StatusCode code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK" or "<CODE>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(std::string_view prefix) const;

  // Keeps the first error: if this is OK, becomes `other` (as
  // absl::Status::Update). For code that goes on after a failure and
  // reports the first one.
  void Update(const Status& other) {
    if (ok() && !other.ok()) *this = other;
  }

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status FailedPreconditionError(std::string message);
Status ResourceExhaustedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status UnimplementedError(std::string message);

namespace status_internal {
// Writes "StatusOr holds no value: <status.ToString()>" to stderr and aborts.
// What StatusOr's accessors do when called on an error.
[[noreturn]] void DieOfMissingValue(const Status& status);
}  // namespace status_internal

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok(). An OK status without a value becomes kInternal.
  StatusOr(Status status)  // NOLINT: implicit, as in absl::StatusOr
      : status_(status.ok() ? InternalError("StatusOr built from an OK status "
                                            "without a value")
                            : std::move(status)) {}
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // The value. REQUIRES: ok(). Calling them on an error is a bug in the
  // caller: in every build they print the status (ToString) to stderr and
  // abort the program, rather than read a value that is not there.
  T& value() & { return CheckedValue(); }
  const T& value() const& { return CheckedValue(); }
  T&& value() && { return std::move(CheckedValue()); }
  T& operator*() & { return CheckedValue(); }
  const T& operator*() const& { return CheckedValue(); }
  T&& operator*() && { return std::move(CheckedValue()); }
  T* operator->() { return &CheckedValue(); }
  const T* operator->() const { return &CheckedValue(); }

 private:
  T& CheckedValue() {
    if (!value_.has_value()) status_internal::DieOfMissingValue(status_);
    return *value_;
  }
  const T& CheckedValue() const {
    if (!value_.has_value()) status_internal::DieOfMissingValue(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace offload

#define OFFLOAD_STATUS_CONCAT_INNER_(a, b) a##b
#define OFFLOAD_STATUS_CONCAT_(a, b) OFFLOAD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define OFFLOAD_RETURN_IF_ERROR(expr)                   \
  do {                                                  \
    ::offload::Status offload_status_ = (expr);         \
    if (!offload_status_.ok()) return offload_status_;  \
  } while (false)

// `lhs = value of expr` (a StatusOr), or returns its status if not OK.
#define OFFLOAD_ASSIGN_OR_RETURN(lhs, expr)                                 \
  OFFLOAD_ASSIGN_OR_RETURN_IMPL_(                                           \
      OFFLOAD_STATUS_CONCAT_(offload_statusor_, __LINE__), lhs, expr)
#define OFFLOAD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

#endif  // OFFLOAD_ENGINE_STATUS_H_
