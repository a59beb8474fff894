// Diagnostics: where the engine's warnings go, readable by tests.

#ifndef OFFLOAD_ENGINE_DIAGNOSTICS_H_
#define OFFLOAD_ENGINE_DIAGNOSTICS_H_

#include <string>
#include <vector>

namespace offload {

class Diagnostics {
 public:
  // `echo_to_stderr`: also print each warning to stderr as it comes.
  explicit Diagnostics(bool echo_to_stderr = false)
      : echo_to_stderr_(echo_to_stderr) {}

  void Warn(std::string message);

  // Every warning so far, oldest first.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Number of warnings containing `text`.
  int Count(const std::string& text) const;

 private:
  bool echo_to_stderr_;
  std::vector<std::string> warnings_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_DIAGNOSTICS_H_
