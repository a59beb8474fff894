#include "bench/flags.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload::bench {
namespace {

Flags Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "layer_stack_bench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(BenchFlagsTest, ValuesAndDefaults) {
  Flags f = Parse({"--hidden=512", "--layers=6", "--budget_k=2,3.5", "--sim_only",
                   "--push_at=layer", "--graph_k=0,2"});
  EXPECT_EQ(f.shape.hidden, 512);
  EXPECT_EQ(f.shape.layers, 6);
  EXPECT_EQ(f.kmax, 4);  // layers - 2
  EXPECT_EQ(f.budget_k, (std::vector<double>{2, 3.5}));
  EXPECT_EQ(f.graph_k, (std::vector<int>{0, 2}));
  EXPECT_TRUE(f.sim_only);
  EXPECT_EQ(f.shape.push_at, PushAt::kLayer);
}

TEST(BenchFlagsDeathTest, EachMistakeNamesTheFlagAndExitsTwo) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--hidden=big"}, "--hidden=big: not an integer"},
      {{"--layers=0"}, "--layers=0: must be at least 1"},
      {{"--push_at=block"}, "--push_at=block: must be gemm or layer"},
      {{"--budget_k=1,x"}, "--budget_k=1,x: not a list of numbers"},
      {{"--layers=4", "--joint_k=5"}, "--joint_k=5: values must be in \\[0, --layers\\)"},
      {{"--graph_k=1.5"}, "--graph_k=1.5: values must be integers"},
      {{"--retain=yes"}, "--retain=yes: takes no value"},
      {{"--no_such=1"}, "unknown flag --no_such"},
  };
  for (const auto& c : cases) {
    EXPECT_EXIT(Parse(c.args), ::testing::ExitedWithCode(2), c.message)
        << c.args.back();
  }
}

TEST(BenchFlagsDeathTest, HelpExitsZero) {
  EXPECT_EXIT(Parse({"--help"}), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace offload::bench
