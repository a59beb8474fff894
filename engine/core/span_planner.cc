#include "engine/core/span_planner.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace offload {
namespace {

int64_t AlignDown(int64_t bytes) { return bytes / kSpanAlignment * kSpanAlignment; }

// Views with the same layout are the same bytes: count them once.
using Layout = std::tuple<DType, std::vector<int64_t>, std::vector<int64_t>,
                          int64_t>;
Layout LayoutOf(const Tensor& t) {
  return {t.dtype, t.shape, t.strides, t.offset};
}

struct Interval {
  int64_t begin;
  int64_t end;
  std::vector<int> tensors;
};

}  // namespace

SpanPlan PlanSpans(const std::vector<const Tensor*>& tensors,
                    double min_coverage) {
  // Storages in order of first use.
  std::vector<Storage*> order;
  std::map<Storage*, std::vector<int>> by_storage;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const Tensor& t = *tensors[i];
    if (t.numel() == 0) continue;
    Storage* storage = t.storage.get();
    auto [it, inserted] = by_storage.try_emplace(storage);
    if (inserted) order.push_back(storage);
    it->second.push_back(i);
  }

  SpanPlan plan;
  for (Storage* storage : order) {
    const std::vector<int>& members = by_storage[storage];
    std::shared_ptr<Storage> shared = tensors[members[0]]->storage;

    bool whole = false;
    int64_t lo = INT64_MAX, hi = 0, covered = 0;
    std::map<Layout, std::vector<int>> unique;  // layout -> tensors
    for (int i : members) {
      const Tensor& t = *tensors[i];
      whole |= t.flags.offload_base;
      auto [begin, end] = t.ByteExtent();
      lo = std::min(lo, begin);
      hi = std::max(hi, end);
      auto [it, inserted] = unique.try_emplace(LayoutOf(t));
      if (inserted) covered += t.nbytes();
      it->second.push_back(i);
    }
    if (whole) {
      plan.spans.push_back(PlannedSpan{shared, 0, storage->size_bytes(), members});
      continue;
    }
    double coverage = static_cast<double>(std::min(covered, hi - lo)) /
                      static_cast<double>(hi - lo);
    if (coverage >= min_coverage) {
      plan.spans.push_back(PlannedSpan{shared, AlignDown(lo), hi, members});
      continue;
    }

    // Too sparse together: look at each distinct view on its own.
    std::vector<Interval> dense;
    for (const auto& [layout, same] : unique) {
      const Tensor& t = *tensors[same[0]];
      auto [begin, end] = t.ByteExtent();
      double own = static_cast<double>(t.nbytes()) /
                   static_cast<double>(end - begin);
      if (own >= min_coverage) {
        dense.push_back(Interval{AlignDown(begin), end, same});
      } else {
        for (int i : same) {
          plan.sparse.push_back(i);
          plan.sparse_coverage.push_back(own);
        }
      }
    }
    // Merge overlapping dense intervals into spans.
    std::sort(dense.begin(), dense.end(),
              [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    std::vector<Interval> merged;
    for (Interval& interval : dense) {
      if (!merged.empty() && interval.begin < merged.back().end) {
        merged.back().end = std::max(merged.back().end, interval.end);
        merged.back().tensors.insert(merged.back().tensors.end(),
                                     interval.tensors.begin(),
                                     interval.tensors.end());
      } else {
        merged.push_back(std::move(interval));
      }
    }
    for (Interval& interval : merged) {
      std::sort(interval.tensors.begin(), interval.tensors.end());
      plan.spans.push_back(PlannedSpan{shared, interval.begin, interval.end,
                                       std::move(interval.tensors)});
    }
  }
  // Sparse tensors in input order.
  std::vector<int> index(plan.sparse.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>(i);
  std::sort(index.begin(), index.end(),
            [&](int a, int b) { return plan.sparse[a] < plan.sparse[b]; });
  SpanPlan sorted;
  sorted.spans = std::move(plan.spans);
  for (int i : index) {
    sorted.sparse.push_back(plan.sparse[i]);
    sorted.sparse_coverage.push_back(plan.sparse_coverage[i]);
  }
  return sorted;
}

}  // namespace offload
