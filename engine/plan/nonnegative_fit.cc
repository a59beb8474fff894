#include "engine/plan/nonnegative_fit.h"

#include <cmath>
#include <cstddef>
#include <utility>

namespace offload {

std::array<double, 3> NonNegativeFit(
    const std::vector<std::array<double, 3>>& rows,
    const std::vector<double>& e) {
  auto sse = [&](const std::array<double, 3>& x) {
    double sum = 0;
    for (size_t t = 0; t < rows.size(); ++t) {
      const double r = e[t] - (rows[t][0] * x[0] + rows[t][1] * x[1] +
                               rows[t][2] * x[2]);
      sum += r * r;
    }
    return sum;
  };
  std::array<double, 3> best = {0, 0, 0};
  double best_sse = sse(best);
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> vars;
    for (int v = 0; v < 3; ++v) {
      if (mask & (1 << v)) vars.push_back(v);
    }
    const size_t k = vars.size();
    std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0));
    for (size_t t = 0; t < rows.size(); ++t) {
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < k; ++j) {
          a[i][j] += rows[t][vars[i]] * rows[t][vars[j]];
        }
        a[i][k] += rows[t][vars[i]] * e[t];
      }
    }
    bool singular = false;
    for (size_t col = 0; col < k && !singular; ++col) {
      size_t pivot = col;
      for (size_t r = col + 1; r < k; ++r) {
        if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
      }
      if (std::abs(a[pivot][col]) < 1e-9) {
        singular = true;
        break;
      }
      std::swap(a[col], a[pivot]);
      for (size_t r = 0; r < k; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (size_t c = col; c <= k; ++c) a[r][c] -= f * a[col][c];
      }
    }
    if (singular) continue;
    std::array<double, 3> x = {0, 0, 0};
    bool negative = false;
    for (size_t i = 0; i < k; ++i) {
      x[vars[i]] = a[i][k] / a[i][i];
      negative = negative || x[vars[i]] < 0;
    }
    if (negative) continue;
    const double fit = sse(x);
    if (fit < best_sse) {
      best_sse = fit;
      best = x;
    }
  }
  return best;
}

}  // namespace offload
