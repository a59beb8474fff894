// Retrying a call through failures a FaultInjectingBackend injected
// (testing/fault_backend.h), for the engine's fault tests and the fault
// properties: one loop, each caller saying how a wrong failure is reported
// (a gtest failure, a RapidCheck one).

#ifndef OFFLOAD_TESTING_INJECTED_RETRY_H_
#define OFFLOAD_TESTING_INJECTED_RETRY_H_

#include <string>

#include "engine/status.h"

namespace offload {

// Whether `status` looks like an injected failure: kResourceExhausted or
// kInternal.
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

// How many times RetryInjected calls before giving up.
inline constexpr int kInjectedRetries = 65;

// Calls `call` (returning a Status or a StatusOr) until it succeeds, at most
// kInjectedRetries times; returns the last result. Each failure that is not
// injected-looking, or has no message, is reported as complain(text) with
// `what` in the text (the caller's way of failing a test; if complain
// returns, the retries go on).
template <typename Call, typename Complain>
auto RetryInjected(const std::string& what, Call call, Complain complain) {
  for (int attempt = 1;; ++attempt) {
    auto result = call();
    const Status status = StatusOf(result);
    if (status.ok() || attempt == kInjectedRetries) return result;
    if (!Injected(status)) complain(what + ": unexpected " + status.ToString());
    if (status.message().empty()) complain(what + ": error without a message");
  }
}

}  // namespace offload

#endif  // OFFLOAD_TESTING_INJECTED_RETRY_H_
