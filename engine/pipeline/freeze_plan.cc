#include "engine/pipeline/freeze_plan.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>

namespace offload {

int FractionKeptOnDevice(int n, double f) {
  constexpr int64_t kScale = 1000000;
  const int64_t offloaded = std::llround(f * kScale);  // f in millionths
  return static_cast<int>(int64_t{n} * (kScale - offloaded) / kScale);
}

FrozenPlan FreezePlan(const std::vector<RecordedChunk>& chunks,
                      const std::vector<int>& backward_order,
                      const FreezeOptions& options) {
  FrozenPlan plan;
  for (const RecordedChunk& chunk : chunks) {
    std::vector<GroupDecision> decisions;
    for (const RecordedGroup& group : chunk.groups) {
      decisions.push_back(group.offloaded && group.bytes > 0
                              ? GroupDecision::kOffload
                              : GroupDecision::kNotEligible);
    }
    plan.decision.push_back(std::move(decisions));
  }
  auto offloaded = [&](int c, int g) {
    return plan.decision[c][g] == GroupDecision::kOffload;
  };

  // (a) Margin: per name, the earliest backward chunk that has it keeps its
  // last one (the highest ordinal) on device.
  std::map<std::string, bool> margin_done;
  for (int c : backward_order) {
    const std::vector<RecordedGroup>& groups = chunks[c].groups;
    std::map<std::string, int> last;  // name -> group index, this chunk
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!offloaded(c, static_cast<int>(g))) continue;
      auto it = last.find(groups[g].name);
      if (it == last.end() || groups[it->second].ordinal < groups[g].ordinal) {
        last[groups[g].name] = static_cast<int>(g);
      }
    }
    for (const auto& [name, g] : last) {
      if (margin_done[name]) continue;
      margin_done[name] = true;
      plan.decision[c][g] = GroupDecision::kMargin;
    }
  }

  // (b) Rank delta.
  // rank × delta saturates: a product beyond int64 keeps every group (the
  // front door refuses such options; the pure function stays defined).
  int64_t amount = 0;
  if (__builtin_mul_overflow(int64_t{options.pipeline_rank},
                             options.delta_bytes, &amount)) {
    amount = std::numeric_limits<int64_t>::max();
  }
  int64_t kept = 0;
  for (int c : backward_order) {
    for (size_t g = 0; g < chunks[c].groups.size() && kept < amount; ++g) {
      if (!offloaded(c, static_cast<int>(g))) continue;
      plan.decision[c][g] = GroupDecision::kRankDelta;
      kept += chunks[c].groups[g].bytes;
    }
  }

  // (c) Fraction, per chunk: the latest groups stay.
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<int> eligible;
    for (size_t g = 0; g < chunks[c].groups.size(); ++g) {
      if (offloaded(static_cast<int>(c), static_cast<int>(g))) {
        eligible.push_back(static_cast<int>(g));
      }
    }
    const int keep = FractionKeptOnDevice(static_cast<int>(eligible.size()),
                                          options.fraction);
    for (int i = 0; i < keep; ++i) {
      plan.decision[c][eligible[eligible.size() - 1 - i]] =
          GroupDecision::kFraction;
    }
  }
  return plan;
}

OffloadSummary Summarize(const std::vector<RecordedChunk>& chunks,
                         const FrozenPlan& plan, int pipeline_rank) {
  OffloadSummary summary;
  summary.pipeline_rank = pipeline_rank;
  std::map<std::string, size_t> index;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (size_t g = 0; g < chunks[c].groups.size(); ++g) {
      const RecordedGroup& group = chunks[c].groups[g];
      auto [it, added] = index.emplace(group.name, summary.names.size());
      if (added) summary.names.push_back(GroupNameSummary{group.name});
      GroupNameSummary& row = summary.names[it->second];
      ++row.groups;
      if (plan.decision[c][g] != GroupDecision::kOffload) continue;
      ++row.offloaded_groups;
      row.offloaded_bytes += group.bytes;
      row.caller_held_bytes += group.caller_held_bytes;
      summary.offloaded_bytes += group.bytes;
      summary.caller_held_bytes += group.caller_held_bytes;
    }
  }
  return summary;
}

}  // namespace offload
