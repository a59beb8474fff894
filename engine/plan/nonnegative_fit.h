// Non-negative least squares in three unknowns, for the warm-up race's fit
// of what re-run units hold beyond the model (joint_race.h, FitExcess).
// Pure function.

#ifndef OFFLOAD_ENGINE_PLAN_NONNEGATIVE_FIT_H_
#define OFFLOAD_ENGINE_PLAN_NONNEGATIVE_FIT_H_

#include <array>
#include <vector>

namespace offload {

// The x >= 0 with the least sum over t of (e[t] - rows[t] . x)^2: each
// subset of the three unknowns solved by least squares on its own
// (Gaussian elimination of the normal equations), the others 0, and the
// best of those whose solution is not negative; the non-negative optimum is
// one of them. All zero where no subset fits better than zero (or there
// are no rows). REQUIRES: rows.size() == e.size().
std::array<double, 3> NonNegativeFit(
    const std::vector<std::array<double, 3>>& rows,
    const std::vector<double>& e);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_NONNEGATIVE_FIT_H_
