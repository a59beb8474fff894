// actoffload._C.plan_joint, evaluate_joint, smallest_joint_budget and
// joint_limit: the engine's joint
// keep / offload / recompute planner (engine/joint_plan.h, SPEC §4.8) for
// the profile the package measures (actoffload/budget.py). One engine call
// each; Python does not plan.

#include <torch/extension.h>

#include <optional>
#include <string>
#include <vector>

#include "engine/joint_limit.h"
#include "engine/joint_plan.h"
#include "python/actoffload/csrc/loop_binding.h"
#include "python/actoffload/csrc/session.h"

namespace actoffload {
namespace {

namespace py = pybind11;

// A unit from a dict with UnitCost's field names (missing ones are 0,
// offloadable true; forward_transient_bytes and backward_transient_bytes
// are optional too).
offload::UnitCost UnitOf(const py::dict& d) {
  auto get = [&](const char* key) -> py::object {
    return d.contains(key) ? d[key] : py::object(py::int_(0));
  };
  offload::UnitCost u;
  u.saved_bytes = get("saved_bytes").cast<int64_t>();
  u.forward_ns = get("forward_ns").cast<double>();
  u.backward_ns = get("backward_ns").cast<double>();
  u.recomputable = get("recomputable").cast<bool>();
  u.input_bytes = get("input_bytes").cast<int64_t>();
  u.recompute_ns = get("recompute_ns").cast<double>();
  u.recompute_bytes = get("recompute_bytes").cast<int64_t>();
  u.offloadable = d.contains("offloadable") ? d["offloadable"].cast<bool>() : true;
  u.forward_transient_bytes = get("forward_transient_bytes").cast<int64_t>();
  u.backward_transient_bytes = get("backward_transient_bytes").cast<int64_t>();
  return u;
}

offload::JointProblem ProblemOf(const std::vector<py::dict>& units,
                                double d2h_gbps, double h2d_gbps,
                                int64_t budget, bool allow_offload,
                                bool allow_recompute) {
  offload::JointProblem p;
  for (const py::dict& d : units) p.units.push_back(UnitOf(d));
  p.d2h_gbps = d2h_gbps;
  p.h2d_gbps = h2d_gbps;
  p.budget = budget;
  p.allow_offload = allow_offload;
  p.allow_recompute = allow_recompute;
  return p;
}

py::dict PlanDict(const offload::JointPlan& plan,
                  const offload::JointProblem& p) {
  py::list choice;
  for (offload::UnitChoice c : plan.choice) {
    choice.append(offload::UnitChoiceName(c));
  }
  py::dict out;
  out["choice"] = choice;
  out["step_ns"] = plan.step_ns;
  out["stall_ns"] = plan.stall_ns;
  out["recompute_ns"] = plan.recompute_ns;
  out["peak_bytes"] = plan.peak_bytes;
  out["offloaded_bytes"] = plan.offloaded_bytes;
  out["released_during"] = plan.released_during;
  out["reloaded_during"] = plan.reloaded_during;
  out["text"] = offload::FormatJointPlan(plan, p);
  return out;
}

}  // namespace

void BindJointPlan(py::module& m) {
  m.def(
      "plan_joint",
      [](const std::vector<py::dict>& units, double d2h_gbps, double h2d_gbps,
         int64_t budget, bool allow_offload, bool allow_recompute) -> py::object {
        const offload::JointProblem p = ProblemOf(
            units, d2h_gbps, h2d_gbps, budget, allow_offload, allow_recompute);
        offload::StatusOr<offload::JointPlan> plan = offload::PlanJoint(p);
        if (plan.status().code() == offload::StatusCode::kResourceExhausted) {
          return py::none();  // no plan fits: smallest_joint_budget says what does
        }
        return PlanDict(ValueOrThrow(std::move(plan)), p);
      },
      "PlanJoint: a dict (choice per unit, predicted step_ns, peak_bytes, "
      "text) or None when no plan fits the budget",
      py::arg("units"), py::arg("d2h_gbps"), py::arg("h2d_gbps"),
      py::arg("budget"), py::arg("allow_offload") = true,
      py::arg("allow_recompute") = true);
  m.def(
      "smallest_joint_budget",
      [](const std::vector<py::dict>& units, double d2h_gbps, double h2d_gbps,
         bool allow_offload, bool allow_recompute) {
        return ValueOrThrow(offload::SmallestJointBudget(ProblemOf(
            units, d2h_gbps, h2d_gbps, 1, allow_offload, allow_recompute)));
      },
      "SmallestJointBudget: the least budget some plan fits",
      py::arg("units"), py::arg("d2h_gbps"), py::arg("h2d_gbps"),
      py::arg("allow_offload") = true, py::arg("allow_recompute") = true);
  m.def(
      "evaluate_joint",
      [](const std::vector<py::dict>& units, double d2h_gbps, double h2d_gbps,
         int64_t budget, const std::vector<bool>& recompute, bool allow_offload)
          -> py::object {
        const offload::JointProblem p = ProblemOf(
            units, d2h_gbps, h2d_gbps, budget, allow_offload, true);
        offload::StatusOr<offload::JointPlan> plan =
            offload::EvaluateJoint(p, recompute);
        if (plan.status().code() == offload::StatusCode::kResourceExhausted) {
          return py::none();
        }
        return PlanDict(ValueOrThrow(std::move(plan)), p);
      },
      "EvaluateJoint: the plan (dict) for the given recomputed units, or None "
      "when it does not fit the budget",
      py::arg("units"), py::arg("d2h_gbps"), py::arg("h2d_gbps"),
      py::arg("budget"), py::arg("recompute"), py::arg("allow_offload") = true);
  m.def(
      "joint_limit",
      [](const std::vector<py::dict>& units, double d2h_gbps, double h2d_gbps,
         int64_t budget, bool allow_offload, bool allow_recompute) -> py::object {
        offload::StatusOr<offload::JointLimitResult> limit =
            offload::JointLimit(ProblemOf(units, d2h_gbps, h2d_gbps, budget,
                                          allow_offload, allow_recompute));
        if (limit.status().code() == offload::StatusCode::kResourceExhausted) {
          return py::none();
        }
        const offload::JointLimitResult result = ValueOrThrow(std::move(limit));
        py::list choice;
        for (offload::UnitChoice c : result.choice) {
          choice.append(offload::UnitChoiceName(c));
        }
        py::dict out;
        out["step_ns"] = result.step_ns;
        out["compute_ns"] = result.compute_ns;
        out["choice"] = choice;
        return out;
      },
      "JointLimit: the least step any choice of the units can have under the "
      "budget (dict), or None when none fits; at most 14 units",
      py::arg("units"), py::arg("d2h_gbps"), py::arg("h2d_gbps"),
      py::arg("budget"), py::arg("allow_offload") = true,
      py::arg("allow_recompute") = true);
}

}  // namespace actoffload
