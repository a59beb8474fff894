#include "engine/saved_tensor.h"

#include <atomic>

namespace offload {

uint64_t NewSavedTensorOwnerId() {
  // Process-wide on purpose: ids must never repeat, whatever the address
  // the next front door is built at.
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace offload
