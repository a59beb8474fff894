#include "bench/limit.h"

#include <glpk.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace offload::bench {
namespace {

// The program is built in megabytes (1e6 B) and milliseconds, so that a
// bandwidth in GB/s is in MB/ms and every coefficient is near 1.
constexpr double kMB = 1e6;

// Whether some kernel start finds `t` allowed off the device: after it was
// ready and its last forward reader, before it is needed back.
bool Offloadable(const LimitTensor& t) {
  return t.needed_at >= 0 && std::max(t.free_after, t.ready) + 1 < t.needed_at;
}

// The kernels at whose start `t` occupies memory.
bool LiveAt(const LimitTensor& t, int k) {
  return std::max(t.producer, 0) <= k && k <= t.last_use;
}

// Whether `t` may be partly off the device at the start of kernel k.
bool MayBeOutAt(const LimitTensor& t, int k) {
  return Offloadable(t) && k > std::max(t.free_after, t.ready) &&
         k < t.needed_at;
}

Status Validate(const LimitProblem& p) {
  const int n = int(p.kernel_ms.size());
  for (double d : p.kernel_ms) {
    if (!(d >= 0)) return InvalidArgumentError("a kernel duration < 0");
  }
  bool copies = false;
  for (size_t j = 0; j < p.tensors.size(); ++j) {
    const LimitTensor& t = p.tensors[j];
    const std::string which = "tensor " + std::to_string(j) + ": ";
    if (t.bytes < 0) return InvalidArgumentError(which + "bytes < 0");
    if (t.producer < -1 || t.producer >= n) {
      return InvalidArgumentError(which + "producer out of range");
    }
    if (t.ready < t.producer || t.ready >= n) {
      return InvalidArgumentError(which + "ready before producer or past end");
    }
    if (t.free_after < t.producer || t.free_after >= n) {
      return InvalidArgumentError(which + "free_after out of range");
    }
    if (t.needed_at >= 0 && t.needed_at <= t.free_after) {
      return InvalidArgumentError(which + "needed_at <= free_after");
    }
    if (t.last_use < std::max({t.producer, t.needed_at, t.free_after}) ||
        t.last_use >= n) {
      return InvalidArgumentError(which + "last_use out of range");
    }
    copies = copies || Offloadable(t);
  }
  const LimitBandwidth& b = p.bandwidth;
  if (copies && !(b.d2h > 0 && b.h2d > 0)) {
    return InvalidArgumentError("a non-positive bandwidth");
  }
  if (b.both_d2h < 0 || b.both_h2d < 0) {
    return InvalidArgumentError("a negative duplex bandwidth");
  }
  return OkStatus();
}

// The rows of the program as (row, column, value) triplets, for
// glp_load_matrix (1-based, index 0 unused).
class Matrix {
 public:
  Matrix() : rows_(1, 0), cols_(1, 0), vals_(1, 0.0) {}
  void Add(int row, int col, double v) {
    if (v == 0) return;
    rows_.push_back(row);
    cols_.push_back(col);
    vals_.push_back(v);
  }
  void Load(glp_prob* lp) {
    glp_load_matrix(lp, int(rows_.size()) - 1, rows_.data(), cols_.data(),
                    vals_.data());
  }

 private:
  std::vector<int> rows_, cols_;
  std::vector<double> vals_;
};

struct ProbDeleter {
  void operator()(glp_prob* lp) const { glp_delete_prob(lp); }
};

// The copy-rate region per slot: rows  d*D + h*H <= length  (D and H the
// MB copied each way in the slot). With contention it is the convex hull of
// alone-D, alone-H and both-at-once; where both at once is slower than
// taking turns, it is the turns' triangle.
struct RateRow {
  double d = 0, h = 0;
};

std::vector<RateRow> RateRows(const LimitBandwidth& b) {
  const double a = b.d2h, e_alone = b.h2d;
  const double c = b.both_d2h > 0 ? std::min(b.both_d2h, a) : a;
  const double e = b.both_h2d > 0 ? std::min(b.both_h2d, e_alone) : e_alone;
  if (c / a + e / e_alone <= 1) return {{1 / a, 1 / e_alone}};
  // Facet through (a, 0) and (c, e); facet through (0, b) and (c, e).
  return {{1 / a, (a - c) / (a * e)}, {(e_alone - e) / (e_alone * c),
                                        1 / e_alone}};
}

}  // namespace

int64_t MinimumResidentBytes(const LimitProblem& p) {
  int64_t most = 0;
  for (int k = 0; k < int(p.kernel_ms.size()); ++k) {
    int64_t must = 0;
    for (const LimitTensor& t : p.tensors) {
      if (LiveAt(t, k) && !MayBeOutAt(t, k)) must += t.bytes;
    }
    most = std::max(most, must);
  }
  return most;
}

StatusOr<LimitResult> ComputeLimit(const LimitProblem& p) {
  if (Status s = Validate(p); !s.ok()) return s;
  const int n = int(p.kernel_ms.size());
  LimitResult result;
  for (double d : p.kernel_ms) result.kernels_ms += d;
  result.stall_ms.assign(n, 0.0);
  if (p.budget_bytes < MinimumResidentBytes(p)) return result;  // infeasible

  std::unique_ptr<glp_prob, ProbDeleter> owner(glp_create_prob());
  glp_prob* lp = owner.get();
  glp_set_obj_dir(lp, GLP_MIN);
  Matrix m;
  auto new_col = [&](double lo, double hi, double cost) {
    const int c = glp_add_cols(lp, 1);
    if (hi > lo) {
      glp_set_col_bnds(lp, c, GLP_DB, lo, hi);
    } else if (hi == lo) {
      glp_set_col_bnds(lp, c, GLP_FX, lo, lo);
    } else {
      glp_set_col_bnds(lp, c, GLP_LO, lo, 0.0);
    }
    glp_set_obj_coef(lp, c, cost);
    return c;
  };
  auto new_row = [&](int type, double lo, double hi) {
    const int r = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, r, type, lo, hi);
    return r;
  };

  // Stalls: column stall[k], minimized. (hi < lo: no upper bound.)
  std::vector<int> stall(n);
  for (int k = 0; k < n; ++k) stall[k] = new_col(0.0, -1.0, 1.0);

  // Slot t = 2k is the stall before kernel k, t = 2k + 1 is kernel k.
  const int slots = 2 * n;
  const std::vector<RateRow> rate_rows = RateRows(p.bandwidth);
  // Per slot and rate row, the row's index, created when first needed.
  std::vector<std::vector<int>> rate_row(rate_rows.size(),
                                         std::vector<int>(slots, 0));
  auto rate_row_of = [&](size_t q, int t) {
    int& r = rate_row[q][t];
    if (r == 0) {
      if (t % 2 == 0) {  // copies in a stall: at most its length
        r = new_row(GLP_UP, 0.0, 0.0);
        m.Add(r, stall[t / 2], -1.0);
      } else {
        r = new_row(GLP_UP, 0.0, p.kernel_ms[t / 2]);
      }
    }
    return r;
  };

  // Per kernel, the columns of the bytes off the device at its start.
  std::vector<std::vector<int>> out_at(n);
  for (const LimitTensor& t : p.tensors) {
    if (!Offloadable(t)) continue;
    const double mb = double(t.bytes) / kMB;
    const int t0 = 2 * (t.ready + 1), t1 = 2 * t.needed_at;
    // Cumulative MB copied out (dc) and back (hc) by the end of slot t.
    std::vector<int> dc(slots, 0), hc(slots, 0);
    for (int s = t0; s <= t1; ++s) {
      dc[s] = new_col(0.0, mb, 0.0);
      hc[s] = new_col(0.0, mb, 0.0);
      if (s > t0) {  // cumulative amounts only grow
        const int rd = new_row(GLP_LO, 0.0, 0.0);
        m.Add(rd, dc[s], 1.0);
        m.Add(rd, dc[s - 1], -1.0);
        const int rh = new_row(GLP_LO, 0.0, 0.0);
        m.Add(rh, hc[s], 1.0);
        m.Add(rh, hc[s - 1], -1.0);
      }
      const int back = new_row(GLP_UP, 0.0, 0.0);  // back only what left
      m.Add(back, hc[s], 1.0);
      m.Add(back, dc[s], -1.0);
      // The slot's copies (cumulative differences) use the link.
      for (size_t q = 0; q < rate_rows.size(); ++q) {
        const int r = rate_row_of(q, s);
        m.Add(r, dc[s], rate_rows[q].d);
        m.Add(r, hc[s], rate_rows[q].h);
        if (s > t0) {
          m.Add(r, dc[s - 1], -rate_rows[q].d);
          m.Add(r, hc[s - 1], -rate_rows[q].h);
        }
      }
    }
    for (int k = 0; k < n; ++k) {
      if (!MayBeOutAt(t, k)) continue;
      const int out = new_col(0.0, mb, 0.0);
      out_at[k].push_back(out);
      // Off the device at k's start: copied out minus copied back by then
      // (the slot before kernel k is 2k, its stall),
      const int r1 = new_row(GLP_UP, 0.0, 0.0);
      m.Add(r1, out, 1.0);
      m.Add(r1, dc[2 * k], -1.0);
      m.Add(r1, hc[2 * k], 1.0);
      // and all of it is copied back after k's start (its reload buffer is
      // not allocated yet) and by the start of needed_at.
      const int r2 = new_row(GLP_UP, 0.0, 0.0);
      m.Add(r2, out, 1.0);
      m.Add(r2, hc[t1], -1.0);
      m.Add(r2, hc[2 * k], 1.0);
    }
  }

  // The budget at every kernel start.
  for (int k = 0; k < n; ++k) {
    double live_mb = 0;
    for (const LimitTensor& t : p.tensors) {
      if (LiveAt(t, k)) live_mb += double(t.bytes) / kMB;
    }
    const double excess = live_mb - double(p.budget_bytes) / kMB;
    if (excess <= 0) continue;
    const int r = new_row(GLP_LO, excess, 0.0);
    for (int c : out_at[k]) m.Add(r, c, 1.0);
  }
  m.Load(lp);

  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  const int rc = glp_simplex(lp, &parm);
  const int status = glp_get_status(lp);
  if (rc == GLP_ENOPFS || status == GLP_NOFEAS) return result;
  if (rc != 0 || status != GLP_OPT) {
    return InternalError("GLPK simplex: return code " + std::to_string(rc) +
                         ", status " + std::to_string(status));
  }
  result.feasible = true;
  result.step_ms = result.kernels_ms;
  for (int k = 0; k < n; ++k) {
    result.stall_ms[k] = std::max(0.0, glp_get_col_prim(lp, stall[k]));
    result.step_ms += result.stall_ms[k];
  }
  return result;
}

}  // namespace offload::bench
