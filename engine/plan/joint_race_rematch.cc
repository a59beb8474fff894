// The race's rematch (JointRaceOptions::rematch): before it settles, the
// trials the model predicts faster than the one to keep, measured a little
// slower, run again in turn with it, and the least step of all runs counts;
// where the one to keep offloads, so does the fastest without copies.

#include "engine/plan/joint_race.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "engine/plan/joint_plan.h"

namespace offload {

bool JointRace::StartRematch(const RaceTrial& best) {
  if (rematched_ || options_.rematch <= 0 || options_.rematch_runs < 1 ||
      options_.rematch_plans < 2) {
    return false;
  }
  const double predicted = Predicted(best.plan).step_ns;
  std::vector<std::pair<double, const RaceTrial*>> others;
  const RaceTrial* plain = nullptr;  // the fastest without copies, if best copies
  for (const RaceTrial& t : trials_) {
    const std::vector<UnitChoice>& choice = t.plan.plan.choice;
    if (t.peak_bytes > Allowed() || choice == best.plan.plan.choice ||
        t.step_ns > best.step_ns * (1 + options_.rematch)) {
      continue;
    }
    // (A trial doing more work than another that fits is never kept.)
    const bool outdone = std::any_of(
        trials_.begin(), trials_.end(), [&](const RaceTrial& u) {
          return u.peak_bytes <= Allowed() &&
                 DoesMoreWork(choice, u.plan.plan.choice);
        });
    const double its = Predicted(t.plan).step_ns;
    const bool seen = std::any_of(
        others.begin(), others.end(),
        [&](const auto& o) { return o.second->plan.plan.choice == choice; });
    if (!outdone && !seen && its < predicted) others.push_back({its, &t});
    if (!outdone && best.plan.plan.offloaded_bytes > 0 &&
        t.plan.plan.offloaded_bytes == 0 &&
        (plain == nullptr || t.step_ns < plain->step_ns)) {
      plain = &t;
    }
  }
  std::stable_sort(
      others.begin(), others.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  others.resize(std::min<size_t>(others.size(), options_.rematch_plans - 1));
  if (plain != nullptr &&
      std::none_of(others.begin(), others.end(), [&](const auto& o) {
        return o.second->plan.plan.choice == plain->plan.plan.choice;
      })) {  // after the others, in the last place
    others.resize(std::min<size_t>(others.size(), options_.rematch_plans - 2));
    others.push_back({0, plain});
  }
  if (others.empty()) return false;
  rematched_ = true;
  rematching_ = true;
  rematch_.clear();
  // The others first, the lowest predicted leading; the one to keep last.
  for (size_t i = 1; i < others.size(); ++i) {
    rematch_.push_back(others[i].second->plan);
  }
  rematch_.push_back(best.plan);
  Apply(others.front().second->plan);
  return true;
}

void JointRace::MergeRematchRuns() {
  // As a candidate's, the first run (a new loop: pinned buffers
  // allocated) counts only where it is the only one.
  double step = std::numeric_limits<double>::infinity();
  int64_t peak = 0;
  for (size_t i = runs_.size() > 1 ? 1 : 0; i < runs_.size(); ++i) {
    step = std::min(step, runs_[i].first);
    peak = std::max(peak, runs_[i].second);
  }
  runs_.clear();
  for (std::vector<RaceTrial>* trials : {&trials_, &all_trials_}) {
    for (RaceTrial& t : *trials) {
      if (t.plan.plan.choice == plan_.plan.choice) {
        t.step_ns = std::min(t.step_ns, step);
        t.peak_bytes = std::max(t.peak_bytes, peak);
      }
    }
  }
}

}  // namespace offload
