#include "tools/flag_parser.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace offload {
namespace {

// The integer `text` spells, or the reason it does not fit [min, max].
std::string ParseInteger(const std::string& text, int64_t min, int64_t max,
                         int64_t* out) {
  if (text.empty()) return "needs a value";
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') return "not an integer";
  const bool unbounded = max == std::numeric_limits<int64_t>::max() ||
                         max == std::numeric_limits<int>::max();
  if (errno == ERANGE || value < min || value > max) {
    if (!unbounded) {
      return "must be between " + std::to_string(min) + " and " +
             std::to_string(max);
    }
    return errno == ERANGE || value > max ? "too large"
                                          : "must be at least " + std::to_string(min);
  }
  *out = value;
  return "";
}

std::string Number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

void FlagParser::Add(const std::string& name, Flag flag) {
  flags_[name] = std::move(flag);
}

void FlagParser::Int(const std::string& name, int* out, int64_t min,
                     int64_t max) {
  Add(name, {false, [out, min, max](const std::string& text) {
                int64_t value = 0;
                std::string why = ParseInteger(text, min, max, &value);
                if (why.empty()) *out = static_cast<int>(value);
                return why;
              }});
}

void FlagParser::Int64(const std::string& name, int64_t* out, int64_t min,
                       int64_t max) {
  Add(name, {false, [out, min, max](const std::string& text) {
                return ParseInteger(text, min, max, out);
              }});
}

void FlagParser::UInt64(const std::string& name, uint64_t* out) {
  Add(name, {false, [out](const std::string& text) -> std::string {
                if (text.empty() || text[0] == '-') {
                  return text.empty() ? "needs a value"
                                      : "must be a non-negative integer";
                }
                errno = 0;
                char* end = nullptr;
                const unsigned long long value =
                    std::strtoull(text.c_str(), &end, 10);
                if (end == text.c_str() || *end != '\0') return "not an integer";
                if (errno == ERANGE) return "too large";
                *out = value;
                return "";
              }});
}

void FlagParser::Double(const std::string& name, double* out, double min,
                        bool min_exclusive) {
  Add(name, {false, [out, min, min_exclusive](const std::string& text) {
                if (text.empty()) return std::string("needs a value");
                char* end = nullptr;
                const double value = std::strtod(text.c_str(), &end);
                if (end == text.c_str() || *end != '\0' || !std::isfinite(value)) {
                  return std::string("not a number");
                }
                if (min_exclusive ? !(value > min) : !(value >= min)) {
                  return std::string(min_exclusive ? "must be above "
                                                   : "must be at least ") +
                         Number(min);
                }
                *out = value;
                return std::string();
              }});
}

void FlagParser::String(const std::string& name, std::string* out) {
  Add(name, {false, [out](const std::string& text) {
                *out = text;
                return std::string();
              }});
}

void FlagParser::Bool(const std::string& name, bool* out) {
  Add(name, {true, [out](const std::string&) {
                *out = true;
                return std::string();
              }});
}

void FlagParser::Custom(const std::string& name,
                        std::function<std::string(const std::string&)> set) {
  Add(name, {false, std::move(set)});
}

void FlagParser::Ignore(const std::string& name) {
  Add(name, {false, [](const std::string&) { return std::string(); }});
}

FlagParser::Result FlagParser::Parse(int argc, char** argv) const {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage_.c_str(), stdout);
      return Result::kHelp;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      std::fprintf(stderr, "%s: not a flag (flags are --name=value)\n%s",
                   arg.c_str(), usage_.c_str());
      return Result::kError;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? eq : eq - 2);
    const auto found = flags_.find(name);
    if (found == flags_.end()) {
      std::fprintf(stderr, "unknown flag --%s (--help lists them)\n%s",
                   name.c_str(), usage_.c_str());
      return Result::kError;
    }
    const Flag& flag = found->second;
    if (flag.bare != (eq == std::string::npos)) {
      return Fail(name, eq == std::string::npos ? "" : arg.substr(eq + 1),
                  flag.bare ? "takes no value (write --" + name + ")"
                            : "needs a value (write --" + name + "=...)");
    }
    const std::string value = flag.bare ? "" : arg.substr(eq + 1);
    const std::string why = flag.set(value);
    if (!why.empty()) return Fail(name, value, why);
  }
  return Result::kOk;
}

FlagParser::Result FlagParser::Fail(const std::string& name,
                                    const std::string& value,
                                    const std::string& reason) const {
  std::fprintf(stderr, "--%s=%s: %s\n%s", name.c_str(), value.c_str(),
               reason.c_str(), usage_.c_str());
  return Result::kError;
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace offload
