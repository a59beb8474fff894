// Retry: the fault properties' way through injected failures.

#ifndef OFFLOAD_PROPS_RETRY_H_
#define OFFLOAD_PROPS_RETRY_H_

#include <string>

#include "engine/status.h"
#include "rapidcheck.h"
#include "testing/injected_retry.h"

namespace offload {

// Retries `call` (a Status- or StatusOr-returning callable) while it fails
// with an injected-looking error; fails the property on any other error, an
// error without a message, or when the retries (kInjectedRetries) do not get
// past it. Returns the last (successful) result.
template <typename Call>
auto Retry(const std::string& what, Call call) {
  auto result = RetryInjected(what, call, [](const std::string& text) { RC_FAIL(text); });
  const Status status = StatusOf(result);
  if (!status.ok()) RC_FAIL(what + ": still failing: " + status.ToString());
  return result;
}

}  // namespace offload

#endif  // OFFLOAD_PROPS_RETRY_H_
