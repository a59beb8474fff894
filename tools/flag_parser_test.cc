#include "tools/flag_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Result = FlagParser::Result;

// argv for Parse: a program name, then `args`.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : strings_(std::move(args)) {
    strings_.insert(strings_.begin(), "tool");
    for (std::string& s : strings_) pointers_.push_back(s.data());
  }
  int argc() { return static_cast<int>(pointers_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

struct Parsed {
  Result result;
  std::string err;
  std::string out;
};

class FlagParserTest : public ::testing::Test {
 protected:
  FlagParserTest() : parser_("usage: tool --layers=8\n") {
    parser_.Int("layers", &layers_, 1);
    parser_.Int("offloaded", &offloaded_, 0, 7);
    parser_.Double("gbps", &gbps_, 0, /*min_exclusive=*/true);
    parser_.UInt64("seed", &seed_);
    parser_.String("svg", &svg_);
    parser_.Bool("probe", &probe_);
    parser_.Custom("modules", [](const std::string& v) {
      return v == "core_attn" ? "" : "unknown module " + v;
    });
  }
  Parsed Parse(std::vector<std::string> args) {
    Args a(std::move(args));
    ::testing::internal::CaptureStderr();
    ::testing::internal::CaptureStdout();
    Result r = parser_.Parse(a.argc(), a.argv());
    std::string out = ::testing::internal::GetCapturedStdout();
    return {r, ::testing::internal::GetCapturedStderr(), out};
  }

  FlagParser parser_;
  int layers_ = 8;
  int offloaded_ = 2;
  double gbps_ = 55;
  uint64_t seed_ = 1;
  std::string svg_;
  bool probe_ = false;
};

TEST_F(FlagParserTest, ValuesAreSet) {
  Parsed p = Parse({"--layers=4", "--offloaded=3", "--gbps=12.5", "--seed=9",
                    "--svg=a.svg", "--probe", "--modules=core_attn"});
  EXPECT_EQ(p.result, Result::kOk) << p.err;
  EXPECT_EQ(p.err, "");
  EXPECT_EQ(layers_, 4);
  EXPECT_EQ(offloaded_, 3);
  EXPECT_EQ(gbps_, 12.5);
  EXPECT_EQ(seed_, 9u);
  EXPECT_EQ(svg_, "a.svg");
  EXPECT_TRUE(probe_);
}

TEST_F(FlagParserTest, EachMistakeNamesTheFlagTheValueAndTheReason) {
  struct Case {
    std::string arg;
    std::string message;
  } cases[] = {
      {"--layers=abc", "--layers=abc: not an integer"},
      {"--layers=4x", "--layers=4x: not an integer"},
      {"--layers=0", "--layers=0: must be at least 1"},
      {"--layers=99999999999", "--layers=99999999999: too large"},
      {"--offloaded=99", "--offloaded=99: must be between 0 and 7"},
      {"--gbps=-1", "--gbps=-1: must be above 0"},
      {"--gbps=0", "--gbps=0: must be above 0"},
      {"--gbps=fast", "--gbps=fast: not a number"},
      {"--gbps=nan", "--gbps=nan: not a number"},
      {"--seed=-3", "--seed=-3: must be a non-negative integer"},
      {"--layers=", "--layers=: needs a value"},
      {"--layers", "--layers=: needs a value (write --layers=...)"},
      {"--probe=1", "--probe=1: takes no value (write --probe)"},
      {"--modules=core_atn", "--modules=core_atn: unknown module core_atn"},
      {"--no_such=1", "unknown flag --no_such (--help lists them)"},
      {"layers=4", "layers=4: not a flag"},
  };
  for (const Case& c : cases) {
    Parsed p = Parse({c.arg});
    EXPECT_EQ(p.result, Result::kError) << c.arg;
    EXPECT_THAT(p.err, StartsWith(c.message)) << c.arg;
    EXPECT_THAT(p.err, HasSubstr("usage: tool")) << c.arg;
    EXPECT_EQ(FlagParser::ExitCode(p.result), 2);
  }
  EXPECT_EQ(layers_, 8);  // no refused value was stored
  EXPECT_EQ(gbps_, 55);
}

TEST_F(FlagParserTest, HelpPrintsTheUsageAndSetsNothing) {
  for (const char* help : {"--help", "-h"}) {
    Parsed p = Parse({"--layers=3", help});
    EXPECT_EQ(p.result, Result::kHelp);
    EXPECT_EQ(p.out, "usage: tool --layers=8\n");
    EXPECT_EQ(p.err, "");
    EXPECT_EQ(layers_, 8);
    EXPECT_EQ(FlagParser::ExitCode(p.result), 0);
  }
}

TEST_F(FlagParserTest, FailNamesAFlagForAChecksAcrossFlags) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(parser_.Fail("offloaded", "8", "must be below --layers"),
            Result::kError);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              StartsWith("--offloaded=8: must be below --layers\nusage:"));
}

TEST(SplitListTest, DropsEmptyItems) {
  EXPECT_EQ(SplitList("a,,b,"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(SplitList(""), std::vector<std::string>{});
}

}  // namespace
}  // namespace offload
