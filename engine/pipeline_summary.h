// What the fine-grained mode reports: chunk ids, what it decided after
// warm-up (SPEC §5.4), as data, and Megatron's table of offloaded MB per group name per pipeline rank.

#ifndef OFFLOAD_ENGINE_PIPELINE_SUMMARY_H_
#define OFFLOAD_ENGINE_PIPELINE_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace offload {

// A model chunk of a pipeline rank: (virtual stage, microbatch).
struct ChunkId {
  int stage = 0;       // virtual pipeline stage, 0 .. vpp-1
  int microbatch = 0;  // >= 0

  // "chunk (stage 1, microbatch 3)".
  std::string ToString() const;
  friend bool operator==(const ChunkId&, const ChunkId&) = default;
};

// Why a group is, or is not, offloaded after the freeze.
enum class GroupDecision {
  kOffload,
  kNotEligible,  // its name is not offloaded, or it copied nothing
  kMargin,       // SPEC §5.4(a), or the run-time margin rule
  kRankDelta,    // §5.4(b)
  kFraction,     // §5.4(c)
};

// "offload", "not_eligible", "margin", "rank_delta", "fraction".
const char* GroupDecisionName(GroupDecision decision);

struct GroupNameSummary {
  std::string name;
  int groups = 0;            // per iteration
  int offloaded_groups = 0;  // by the frozen plan
  int64_t offloaded_bytes = 0;
  // Bytes copied whose storage the caller kept alive (offloading them
  // saved no memory: duplicate copies, SPEC §2.5).
  int64_t caller_held_bytes = 0;
};

struct OffloadSummary {
  int pipeline_rank = 0;
  std::vector<GroupNameSummary> names;  // in order of first appearance
  int64_t offloaded_bytes = 0;          // all names
  int64_t caller_held_bytes = 0;
};

// One row per rank, one column per group name (all ranks' names), MB
// offloaded per iteration by the frozen plan, and a total column.
std::string FormatSummaryTable(const std::vector<OffloadSummary>& ranks);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_SUMMARY_H_
