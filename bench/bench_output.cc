#include "bench/bench_output.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace offload::bench {
namespace {

// The cells of a Markdown table row "| a | b |", trimmed; empty when the
// line is not one.
std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  if (line.empty() || line[0] != '|') return cells;
  std::string cell;
  std::istringstream in(line.substr(1));
  while (std::getline(in, cell, '|')) {
    const size_t b = cell.find_first_not_of(' ');
    const size_t e = cell.find_last_not_of(' ');
    cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  return cells;
}

// The number after `key` in `line` ("layers 8" -> 8), or -1.
long long NumberAfter(const std::string& line, const std::string& key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  return std::atoll(line.c_str() + at + key.size());
}

// A cell as a number; "x1.004" reads as 1.004.
double Number(const std::string& cell) {
  return std::atof(cell.c_str() + (cell.rfind('x', 0) == 0 ? 1 : 0));
}

}  // namespace

StatusOr<BenchOutput> ParseBenchOutput(const std::string& text) {
  BenchOutput out;
  enum Section {
    kOther, kPinnedTable, kGemmTable, kSweepTable, kOwnTable, kBudgetTable
  };
  Section section = kOther;
  bool header = false, pinned = false;
  std::array<bool, kGemms> seen{};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# layer_stack_bench:", 0) == 0) {
      out.shape.layers = int(NumberAfter(line, "layers "));
      out.shape.hidden = NumberAfter(line, "hidden ");
      out.shape.tokens = NumberAfter(line, "tokens ");
      header = out.shape.layers > 0 && out.shape.hidden > 0 &&
               out.shape.tokens > 0;
    } else if (line.rfind("# pushes: --push_at=layer", 0) == 0) {
      out.shape.push_at = PushAt::kLayer;
    } else if (line.rfind("## ", 0) == 0) {
      if (line.find("Pinned copy peak") != std::string::npos) {
        section = kPinnedTable;
      } else if (line.find("Per-GEMM") != std::string::npos) {
        section = kGemmTable;
      } else if (line.find("Offloading k of") != std::string::npos) {
        section = kSweepTable;
      } else if (line.find("Byte budget") != std::string::npos) {
        section = kBudgetTable;
      } else if (line.find("own GEMM times") != std::string::npos) {
        section = kOwnTable;
      } else {
        section = kOther;
      }
    }
    const std::vector<std::string> c = Cells(line);
    if (c.size() < 2 || c[1].empty() || c[1][0] == '-') continue;
    // Data rows of the pinned and sweep tables start with a number.
    const bool numbered =
        !c[0].empty() && std::isdigit(static_cast<unsigned char>(c[0][0]));
    if (section == kPinnedTable && numbered && c.size() >= 5) {
      LimitBandwidth& b = out.bandwidth;
      b.d2h = std::max(b.d2h, Number(c[1]));
      b.h2d = std::max(b.h2d, Number(c[2]));
      b.both_d2h = std::max(b.both_d2h, Number(c[3]));
      b.both_h2d = std::max(b.both_h2d, Number(c[4]));
      pinned = true;
    } else if (section == kGemmTable) {
      for (int g = 0; g < kGemms; ++g) {
        if (c[0] == kGemmNames[g]) {
          out.gemm_ms[g] = Number(c[1]);
          seen[g] = true;
        }
      }
    } else if (section == kSweepTable && numbered && c.size() >= 8) {
      BenchRow r;
      r.k = std::atoi(c[0].c_str());
      r.step_ms = Number(c[1]);
      r.peak_gib = Number(c[3]);
      r.bound_ms = Number(c[7]);
      out.rows.push_back(r);
    } else if (section == kOwnTable && numbered && c.size() >= 3) {
      // | k | fwd ms/layer | bwd ms/layer | ...
      for (BenchRow& r : out.rows) {
        if (r.k == std::atoi(c[0].c_str())) {
          r.own_layer_ms = Number(c[1]) + Number(c[2]);
        }
      }
    } else if (section == kBudgetTable && numbered && c.size() >= 9) {
      // | budget k | budget GiB | step ms | ratio | act. peak GiB | ratio |
      //   k-of-n ratios | k-of-n peak ratios | bound ms | ...
      BenchRow r;
      r.k = -1;
      r.budget_k = Number(c[0]);
      r.step_ms = Number(c[2]);
      r.peak_gib = Number(c[4]);
      r.bound_ms = Number(c[8]);
      if (c.size() >= 15) r.own_layer_ms = Number(c[13]) + Number(c[14]);
      out.budget_rows.push_back(r);
    }
  }
  if (!header) return InvalidArgumentError("no '# layer_stack_bench:' line");
  if (!pinned) return InvalidArgumentError("no pinned copy peak table");
  for (int g = 0; g < kGemms; ++g) {
    if (!seen[g]) {
      return InvalidArgumentError(std::string("no time for GEMM '") +
                                  kGemmNames[g] + "'");
    }
  }
  if (out.rows.empty() || out.rows[0].k != 0) {
    return InvalidArgumentError("no k = 0 row in 'Offloading k of n layers'");
  }
  return out;
}

}  // namespace offload::bench
