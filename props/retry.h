// Retry: the fault properties' way through injected failures.

#ifndef OFFLOAD_PROPS_RETRY_H_
#define OFFLOAD_PROPS_RETRY_H_

#include <string>

#include "engine/status.h"
#include "rapidcheck.h"

namespace offload {

// Whether `status` looks like an injected failure (FaultInjectingBackend):
// kResourceExhausted or kInternal.
inline bool Injected(const Status& status) {
  return status.code() == StatusCode::kResourceExhausted ||
         status.code() == StatusCode::kInternal;
}

// The status of a call's result, a Status or a StatusOr.
inline Status StatusOf(const Status& status) { return status; }
template <typename T>
Status StatusOf(const StatusOr<T>& result) {
  return result.status();
}

// Retries `call` (a Status- or StatusOr-returning callable) while it fails
// with an injected-looking error; fails the property on any other error, an
// error without a message, or when 64 retries do not get past it. Returns
// the last (successful) result.
template <typename Call>
auto Retry(const std::string& what, Call call) {
  for (int attempt = 0;; ++attempt) {
    auto result = call();
    const Status status = StatusOf(result);
    if (status.ok()) return result;
    if (!Injected(status)) RC_FAIL(what + ": unexpected " + status.ToString());
    if (status.message().empty()) RC_FAIL(what + ": error without a message");
    if (attempt > 64) RC_FAIL(what + ": still failing: " + status.ToString());
  }
}

}  // namespace offload

#endif  // OFFLOAD_PROPS_RETRY_H_
