// FlagParser: the command-line flags of the tools (--name=value, and bare
// --name for booleans). Every mistake gets one message that names the flag,
// the value and the reason, followed by the usage; --help (or -h) prints the
// usage alone.
//
//   Flags flags;
//   FlagParser parser(kUsage);
//   parser.Int("layers", &flags.layers, /*min=*/1);
//   parser.Double("gbps", &flags.gbps, /*min=*/0, /*min_exclusive=*/true);
//   FlagParser::Result r = parser.Parse(argc, argv);
//   if (r == FlagParser::Result::kOk && flags.offloaded >= flags.layers) {
//     r = parser.Fail("offloaded", ..., "must be below --layers");
//   }
//   if (r != FlagParser::Result::kOk) return parser.ExitCode(r);

#ifndef OFFLOAD_TOOLS_FLAG_PARSER_H_
#define OFFLOAD_TOOLS_FLAG_PARSER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace offload {

class FlagParser {
 public:
  enum class Result { kOk, kHelp, kError };

  explicit FlagParser(std::string usage) : usage_(std::move(usage)) {}

  // Each registers --name, filled in by Parse. REQUIRES: `name` not
  // registered before, `out` outlives the parser.
  // An integer in [min, max], in decimal.
  void Int(const std::string& name, int* out,
           int64_t min = std::numeric_limits<int>::min(),
           int64_t max = std::numeric_limits<int>::max());
  void Int64(const std::string& name, int64_t* out,
             int64_t min = std::numeric_limits<int64_t>::min(),
             int64_t max = std::numeric_limits<int64_t>::max());
  // A non-negative integer.
  void UInt64(const std::string& name, uint64_t* out);
  // A finite number >= min (> min if min_exclusive).
  void Double(const std::string& name, double* out,
              double min = -std::numeric_limits<double>::infinity(),
              bool min_exclusive = false);
  // Any text, empty included.
  void String(const std::string& name, std::string* out);
  // A bare --name sets *out to true (--name=... is an error).
  void Bool(const std::string& name, bool* out);
  // Anything else: `set` parses the value and returns "" or the reason it
  // is refused.
  void Custom(const std::string& name,
              std::function<std::string(const std::string&)> set);
  // --name=anything is accepted and ignored (a flag another parser reads).
  void Ignore(const std::string& name);

  // Parses argv[1..argc). kHelp: --help or -h was given; the usage went to
  // stdout and no flag was set. kError: an unknown flag, a missing value or
  // a value refused; the message ("--name=value: reason") and the usage went
  // to stderr (flags before it are set). kOk otherwise.
  Result Parse(int argc, char** argv) const;

  // For checks across flags, after Parse: prints "--name=value: reason" and
  // the usage to stderr; returns kError.
  Result Fail(const std::string& name, const std::string& value,
              const std::string& reason) const;

  // The process's exit status for a result: 0 for kOk and kHelp, 2 for
  // kError.
  static int ExitCode(Result result) { return result == Result::kError ? 2 : 0; }

  const std::string& usage() const { return usage_; }

 private:
  struct Flag {
    bool bare = false;  // a boolean: no value
    std::function<std::string(const std::string&)> set;
  };
  void Add(const std::string& name, Flag flag);

  std::string usage_;
  std::map<std::string, Flag> flags_;
};

// "a,b,c" split at commas, empty items dropped.
std::vector<std::string> SplitList(const std::string& list);

}  // namespace offload

#endif  // OFFLOAD_TOOLS_FLAG_PARSER_H_
