#include "engine/pipeline_summary.h"

#include <algorithm>
#include <cstdio>

namespace offload {

std::string ChunkId::ToString() const {
  return "chunk (stage " + std::to_string(stage) + ", microbatch " +
         std::to_string(microbatch) + ")";
}

const char* GroupDecisionName(GroupDecision decision) {
  switch (decision) {
    case GroupDecision::kOffload: return "offload";
    case GroupDecision::kNotEligible: return "not_eligible";
    case GroupDecision::kMargin: return "margin";
    case GroupDecision::kRankDelta: return "rank_delta";
    case GroupDecision::kFraction: return "fraction";
  }
  return "unknown";
}

namespace {

std::string Cell(const std::string& text, size_t width) {
  return std::string(width > text.size() ? width - text.size() : 0, ' ') +
         text;
}

std::string Megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(bytes) / 1e6);
  return buf;
}

}  // namespace

std::string FormatSummaryTable(const std::vector<OffloadSummary>& ranks) {
  std::vector<std::string> names;
  for (const OffloadSummary& rank : ranks) {
    for (const GroupNameSummary& row : rank.names) {
      if (std::find(names.begin(), names.end(), row.name) == names.end()) {
        names.push_back(row.name);
      }
    }
  }
  std::vector<std::string> header = {"PP rank"};
  for (const std::string& name : names) header.push_back(name);
  header.push_back("total");
  std::vector<std::vector<std::string>> rows;
  for (const OffloadSummary& rank : ranks) {
    std::vector<std::string> row = {std::to_string(rank.pipeline_rank)};
    for (const std::string& name : names) {
      int64_t bytes = 0;
      for (const GroupNameSummary& r : rank.names) {
        if (r.name == name) bytes = r.offloaded_bytes;
      }
      row.push_back(Megabytes(bytes));
    }
    row.push_back(Megabytes(rank.offloaded_bytes));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) {
    width[i] = header[i].size();
    for (const auto& row : rows) width[i] = std::max(width[i], row[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      out += " " + Cell(cells[i], width[i]) + " |";
    }
    return out + "\n";
  };
  std::string rule = "|";
  for (size_t w : width) rule += std::string(w + 2, '-') + "|";
  std::string out = "Offloaded MB per iteration, by group name and pipeline "
                    "rank (frozen plan)\n" + line(header) + rule + "\n";
  for (const auto& row : rows) out += line(row);
  return out;
}

}  // namespace offload
