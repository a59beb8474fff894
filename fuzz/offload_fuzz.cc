// libFuzzer entry point: input bytes -> FuzzProgram (fuzz_program.h) ->
// RunProgram (fuzz_runner.h); a violation is printed and aborts, so that
// libFuzzer saves the input. OFFLOAD_FUZZ_VERBOSE=1 prints every call and
// its status (for reading a crash input).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "fuzz/fuzz_program.h"
#include "fuzz/fuzz_runner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("OFFLOAD_FUZZ_VERBOSE") != nullptr;
  const offload::fuzz::FuzzProgram program =
      offload::fuzz::DecodeProgram(std::span<const uint8_t>(data, size));
  std::optional<std::string> violation =
      offload::fuzz::RunProgram(program, verbose);
  if (violation.has_value()) {
    std::fprintf(stderr, "offload_fuzz: VIOLATION at %s\n", violation->c_str());
    std::abort();
  }
  return 0;
}
