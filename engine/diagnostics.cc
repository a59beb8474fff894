#include "engine/diagnostics.h"

#include <cstdio>
#include <utility>

namespace offload {

void Diagnostics::Warn(std::string message) {
  if (echo_to_stderr_) std::fprintf(stderr, "offload warning: %s\n", message.c_str());
  warnings_.push_back(std::move(message));
}

int Diagnostics::Count(const std::string& text) const {
  int count = 0;
  for (const std::string& warning : warnings_) {
    if (warning.find(text) != std::string::npos) ++count;
  }
  return count;
}

}  // namespace offload
