#include "engine/plan/longer_batches.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

namespace offload {

LongerBatches::LongerBatches(JointRace& race, int checked_steps, int max_rungs)
    : race_(race),
      checked_steps_(checked_steps),
      max_rungs_(static_cast<size_t>(std::max(max_rungs, 1))) {}

LongerBatches::Key LongerBatches::KeyOf(const LongerPlan& plan) {
  const JointPlan& p = plan.length.plan;
  return Key(plan.ratio, p.choice, p.released_during, p.reloaded_during);
}

const LongerPlan& LongerBatches::Keep(double ratio, LengthPlan length) {
  const int id = next_id_++;
  return plans_[id] = LongerPlan{id, ratio, std::move(length)};
}

const LongerPlan* LongerBatches::Find(int id) const {
  const auto it = plans_.find(id);
  return it == plans_.end() ? nullptr : &it->second;
}

void LongerBatches::Arm(int id) {
  if (checked_steps_ > 0) checks_[id] = checked_steps_;
}

bool LongerBatches::TakeRung(const LongerPlan& plan) {
  const auto rung = rungs_.find(plan.ratio);
  if (rung == rungs_.end()) return false;  // (the race's, or a rung dropped since)
  if (rung->second != plan.id) checks_.erase(rung->second);
  rung->second = plan.id;
  return true;
}

StatusOr<std::optional<LongerPlan>> LongerBatches::ForOneForward(double ratio) {
  if (!(ratio > 1.0)) return std::optional<LongerPlan>();
  const double longest = std::max(seen_, ratio);
  if (race_plan_.has_value() && race_plan_->first == longest) {
    const LongerPlan* plan = Find(race_plan_->second);
    return plan == nullptr ? std::optional<LongerPlan>() : std::optional(*plan);
  }
  race_plan_.emplace(longest, 0);  // failed, until made
  OFFLOAD_ASSIGN_OR_RETURN(LengthPlan length, PlanForLength(race_, longest));
  const LongerPlan& plan = Keep(longest, std::move(length));
  race_plan_->second = plan.id;
  return std::optional(plan);
}

StatusOr<bool> LongerBatches::RaceStepMeasured(double ratio, int id,
                                               int64_t measured_peak_bytes) {
  const LongerPlan* ran = id == 0 ? nullptr : Find(id);
  if (id != 0 && ran == nullptr) {
    return InvalidArgumentError("a step in the race ran plan " + std::to_string(id) +
                                ", and no plan for longer batches has that number");
  }
  if (!(ratio > 1.0)) return false;
  if (ran != nullptr && std::abs(ran->ratio - ratio) > 1e-6 * ratio) {
    return false;  // a batch shorter than the plan's: not its length
  }
  int64_t predicted = 0;
  int64_t needs_budget = 0;
  if (ran != nullptr) {
    predicted = ran->length.plan.peak_bytes;
    needs_budget = ran->length.needs_budget;
  } else {  // the race's own plan, at this length
    OFFLOAD_ASSIGN_OR_RETURN(predicted, PeakAtLength(race_, ratio, race_.plan().choice));
  }
  const double exponent = race_.length_exponent();
  const StatusOr<std::optional<LengthPlan>> made =
      PlanForLengthMeasured(race_, ratio, predicted, needs_budget, measured_peak_bytes);
  const bool raised = race_.length_exponent() != exponent;
  if (raised) race_plan_.reset();  // made anew with the growth
  if (!made.ok()) return made.status();
  return raised;
}

void LongerBatches::RaceSaw(double ratio) { seen_ = std::max(seen_, ratio); }

StatusOr<std::optional<LongerPlan>> LongerBatches::Longest(double ratio) {
  if (!(ratio > longest_)) return std::optional<LongerPlan>();
  longest_ = ratio;
  OFFLOAD_ASSIGN_OR_RETURN(LengthPlan length, PlanForLength(race_, ratio));
  const LongerPlan& plan = Keep(ratio, std::move(length));
  rungs_[ratio] = plan.id;
  Arm(plan.id);
  PruneRungs();
  return std::optional(plan);
}

void LongerBatches::PruneRungs() {
  auto drop = [this](std::map<double, int>::iterator rung) {
    checks_.erase(rung->second);
    return rungs_.erase(rung);
  };
  // The next longer plan's length: the race's own (1) between the shorter
  // rungs and the longer ones.
  auto next_length = [](std::map<double, int>::iterator rung) {
    const double next = std::next(rung)->first;
    return rung->first < 1 && next > 1 ? 1.0 : next;
  };
  for (auto rung = rungs_.begin(); rung != rungs_.end() && std::next(rung) != rungs_.end();) {
    const JointPlan& longer = plans_.at(std::next(rung)->second).length.plan;
    const bool alike = next_length(rung) == std::next(rung)->first &&
                       SameSchedule(plans_.at(rung->second).length.plan, longer);
    rung = alike ? drop(rung) : std::next(rung);
  }
  while (rungs_.size() > max_rungs_) {
    auto nearest = rungs_.begin();
    for (auto rung = rungs_.begin(); std::next(rung) != rungs_.end(); ++rung) {
      if (next_length(rung) / rung->first < next_length(nearest) / nearest->first) {
        nearest = rung;
      }
    }
    drop(nearest);
  }
}

StatusOr<std::optional<LongerPlan>> LongerBatches::ForBatch(double ratio) {
  // (A ratio read from sizes may be a rounding off.)
  if (ratio > 0 && ratio < 1 - 1e-9) return ForShorter(ratio);
  OFFLOAD_ASSIGN_OR_RETURN(std::optional<LongerPlan> made, Longest(ratio));
  if (made.has_value() || !(ratio > 1.0)) return made;
  // The shortest rung at or above it, else the longest.
  auto rung = rungs_.lower_bound(ratio * (1 - 1e-9));
  if (rung == rungs_.end()) {
    if (rungs_.empty() || !(rungs_.rbegin()->first > 1)) return std::optional<LongerPlan>();
    rung = std::prev(rung);
  }
  return std::optional(plans_.at(rung->second));
}

std::optional<LongerPlan> LongerBatches::ForShorter(double ratio) {
  // The nearest shorter lengths planned for, above and below it.
  const auto above = shorter_.lower_bound(ratio);
  const bool apart =
      (above == shorter_.end() || *above >= ratio * kShorterApart) &&
      (above == shorter_.begin() || *std::prev(above) * kShorterApart <= ratio);
  if (apart) {
    shorter_.insert(ratio);
    StatusOr<std::optional<LengthPlan>> length = PlanForShorter(race_, ratio);
    if (length.ok() && length->has_value()) {
      const LongerPlan& plan = Keep(ratio, std::move(**length));
      rungs_[ratio] = plan.id;
      Arm(plan.id);
      PruneRungs();
    }
  }
  const auto rung = rungs_.lower_bound(ratio * (1 - 1e-9));
  if (rung == rungs_.end() || !(rung->first < 1)) return std::nullopt;  // the race's
  return plans_.at(rung->second);
}

std::optional<LongerPlan> LongerBatches::ForEveryBatch() const {
  if (rungs_.empty() || !(rungs_.rbegin()->first > 1)) return std::nullopt;
  return plans_.at(rungs_.rbegin()->second);
}

std::vector<LongerPlan> LongerBatches::Rungs() const {
  std::vector<LongerPlan> out;
  for (const auto& [ratio, id] : rungs_) out.push_back(plans_.at(id));
  return out;
}

StatusOr<LongerBatches::CheckedStep> LongerBatches::StepChecked(
    int id, int64_t measured_peak_bytes) {
  const auto left = checks_.find(id);
  if (left == checks_.end()) {
    return FailedPreconditionError("step of plan " + std::to_string(id) +
                                   " for longer batches checked, and that plan's "
                                   "steps are not checked");
  }
  const LongerPlan checked = plans_.at(id);
  if (checked.ratio < 1) {  // a shorter batch's: it holds, or its rung goes
    CheckedStep out;
    if (measured_peak_bytes <= race_.budget() + race_.options().tolerance_bytes) {
      if (--left->second == 0) checks_.erase(left);
    } else {
      checks_.erase(left);
      out.dropped = rungs_.erase(checked.ratio) > 0;
    }
    return out;
  }
  StatusOr<std::optional<LengthPlan>> made = PlanForLengthMeasured(
      race_, checked.ratio, checked.length.plan.peak_bytes,
      checked.length.needs_budget, measured_peak_bytes);
  if (!made.ok()) {
    checks_.erase(left);
    return made.status();
  }
  CheckedStep out;
  if (!made->has_value()) {  // it held
    if (--left->second == 0) checks_.erase(left);
    return out;
  }
  out.same = SameSchedule((*made)->plan, checked.length.plan);
  out.plan = Keep(checked.ratio, std::move(**made));
  TakeRung(*out.plan);
  checks_.erase(id);
  if (!out.same) Arm(out.plan->id);
  return out;
}

StatusOr<LongerBatches::GivingWay> LongerBatches::OutOfMemory(int failed,
                                                              int held) {
  const LongerPlan* found = Find(failed);
  if (found == nullptr) {
    return InvalidArgumentError("plan " + std::to_string(failed) +
                                " ran out of memory, and no plan for longer "
                                "batches has that number");
  }
  const LongerPlan lost = *found;
  GivingWay out;
  if (lost.ratio < 1) {  // a shorter batch's: its rung goes
    const auto rung = rungs_.find(lost.ratio);
    if (rung != rungs_.end() && rung->second == failed) {
      checks_.erase(failed);
      rungs_.erase(rung);
      out.dropped = true;
    }
    return out;
  }
  out.first_at_length = true;
  for (const Key& key : failed_) {
    if (std::get<0>(key) == lost.ratio) out.first_at_length = false;
  }
  failed_.insert(KeyOf(lost));
  StatusOr<LengthPlan> below =
      PlanForLengthBelow(race_, lost.ratio, lost.length.plan.peak_bytes);
  if (below.ok()) {
    LongerPlan candidate{0, lost.ratio, *below};
    if (failed_.count(KeyOf(candidate)) == 0) {
      out.plan = Keep(lost.ratio, std::move(*below));
      if (TakeRung(*out.plan)) Arm(out.plan->id);
      return out;
    }
  } else {
    out.why = below.status();
  }
  const LongerPlan* again = out.first_at_length ? nullptr : Find(held);
  if (again != nullptr && again->ratio == lost.ratio &&
      !SameSchedule(again->length.plan, lost.length.plan)) {
    out.again = held;
    TakeRung(*again);
  }
  return out;
}

}  // namespace offload
