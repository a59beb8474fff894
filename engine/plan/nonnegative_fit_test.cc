// Non-negative least squares in three unknowns (nonnegative_fit.h).

#include "engine/plan/nonnegative_fit.h"

#include <array>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using Rows = std::vector<std::array<double, 3>>;

TEST(NonNegativeFitTest, RecoversExactNonNegativeCoefficients) {
  const Rows rows = {{1, 0, 2}, {0, 3, 1}, {2, 2, 0}, {4, 1, 1}};
  std::vector<double> e;
  for (const auto& r : rows) e.push_back(40 * r[0] + 25 * r[1] + 10 * r[2]);
  const std::array<double, 3> x = NonNegativeFit(rows, e);
  EXPECT_NEAR(x[0], 40, 1e-9);
  EXPECT_NEAR(x[1], 25, 1e-9);
  EXPECT_NEAR(x[2], 10, 1e-9);
}

// Unconstrained least squares would make the second coefficient negative
// (e falls with it); constrained, it is 0 and the first fits alone.
TEST(NonNegativeFitTest, ANegativeCoefficientIsHeldAtZero) {
  const Rows rows = {{1, 0, 0}, {1, 1, 0}, {2, 1, 0}, {1, 2, 0}};
  const std::vector<double> e = {10, 5, 15, 0};
  const std::array<double, 3> x = NonNegativeFit(rows, e);
  EXPECT_EQ(x[1], 0);
  EXPECT_EQ(x[2], 0);
  // The least squares of e on the first column alone: sum(r e) / sum(r r).
  EXPECT_NEAR(x[0], (10 + 5 + 30 + 0) / 7.0, 1e-9);
}

TEST(NonNegativeFitTest, CollinearColumnsAndNoRowsGiveAFiniteAnswer) {
  EXPECT_EQ(NonNegativeFit({}, {}), (std::array<double, 3>{0, 0, 0}));
  // The first two columns are equal: one of them carries the fit.
  const Rows rows = {{1, 1, 0}, {2, 2, 0}};
  const std::array<double, 3> x = NonNegativeFit(rows, {30, 60});
  EXPECT_NEAR(x[0] + x[1], 30, 1e-9);
  EXPECT_GE(x[0], 0);
  EXPECT_GE(x[1], 0);
}

TEST(NonNegativeFitTest, ExcessesBelowTheModelFitZero) {
  const Rows rows = {{1, 0, 0}, {2, 0, 0}};
  EXPECT_EQ(NonNegativeFit(rows, {-5, -10}), (std::array<double, 3>{0, 0, 0}));
}

}  // namespace
}  // namespace offload
