// actoffload._C.plan_joint, evaluate_joint, smallest_joint_budget and
// joint_limit: the engine's joint keep / offload / recompute / selective
// planner (engine/plan/joint_plan.h, SPEC §4.8) for the profile the
// package measures (actoffload/budget.py). One engine call each; Python
// does not plan. actoffload._C.JointRace: the warm-up race
// that picks the plan the budget mode keeps (engine/plan/joint_race.h), and
// its plan for a longer batch (engine/plan/joint_length.h).
// actoffload._C.LongerBatches: which of those serves when
// (engine/plan/longer_batches.h).

#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "engine/plan/joint_length.h"
#include "engine/plan/joint_limit.h"
#include "engine/plan/joint_plan.h"
#include "engine/plan/joint_race.h"
#include "engine/plan/longer_batches.h"
#include "python/actoffload/csrc/loop_binding.h"
#include "python/actoffload/csrc/session.h"

namespace actoffload {
namespace {

namespace py = pybind11;

// A unit from a dict with UnitCost's field names (missing ones are 0,
// offloadable true; forward_transient_bytes, backward_transient_bytes,
// recompute_forward_transient_bytes and selective recompute's selective, selective_bytes, selective_ns and
// selective transients are optional too: absent, the unit is not
// selective).
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
  u.recompute_forward_transient_bytes =
      get("recompute_forward_transient_bytes").cast<int64_t>();
  u.selective = d.contains("selective") ? d["selective"].cast<bool>() : false;
  u.selective_bytes = get("selective_bytes").cast<int64_t>();
  u.selective_ns = get("selective_ns").cast<double>();
  u.selective_forward_transient_bytes =
      get("selective_forward_transient_bytes").cast<int64_t>();
  u.selective_backward_transient_bytes =
      get("selective_backward_transient_bytes").cast<int64_t>();
  return u;
}

// UnitOf's inverse: a dict with UnitCost's field names.
py::dict UnitDict(const offload::UnitCost& u) {
  py::dict d;
  d["saved_bytes"] = u.saved_bytes;
  d["forward_ns"] = u.forward_ns;
  d["backward_ns"] = u.backward_ns;
  d["recomputable"] = u.recomputable;
  d["offloadable"] = u.offloadable;
  d["input_bytes"] = u.input_bytes;
  d["recompute_ns"] = u.recompute_ns;
  d["recompute_bytes"] = u.recompute_bytes;
  d["forward_transient_bytes"] = u.forward_transient_bytes;
  d["backward_transient_bytes"] = u.backward_transient_bytes;
  d["recompute_forward_transient_bytes"] = u.recompute_forward_transient_bytes;
  d["selective"] = u.selective;
  d["selective_bytes"] = u.selective_bytes;
  d["selective_ns"] = u.selective_ns;
  d["selective_forward_transient_bytes"] = u.selective_forward_transient_bytes;
  d["selective_backward_transient_bytes"] =
      u.selective_backward_transient_bytes;
  return d;
}

// A choice from its name (UnitChoiceName's).
offload::UnitChoice ChoiceOf(const std::string& name) {
  for (offload::UnitChoice c :
       {offload::UnitChoice::kKeep, offload::UnitChoice::kOffload,
        offload::UnitChoice::kRecompute, offload::UnitChoice::kSelective,
        offload::UnitChoice::kSelectiveOffload}) {
    if (name == offload::UnitChoiceName(c)) return c;
  }
  throw py::value_error("unknown unit choice '" + name +
                        "': keep, offload, recompute or selective");
}

// Per unit: a bool (true: recomputed in full) or a choice's name.
std::vector<offload::UnitChoice> ChoicesOf(const py::sequence& items) {
  std::vector<offload::UnitChoice> out;
  for (const py::handle item : items) {
    if (py::isinstance<py::str>(item)) {
      out.push_back(ChoiceOf(item.cast<std::string>()));
    } else {
      out.push_back(item.cast<bool>() ? offload::UnitChoice::kRecompute
                                      : offload::UnitChoice::kKeep);
    }
  }
  return out;
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
  out["selective_ns"] = plan.selective_ns;
  out["peak_bytes"] = plan.peak_bytes;
  out["offloaded_bytes"] = plan.offloaded_bytes;
  out["released_during"] = plan.released_during;
  out["reloaded_during"] = plan.reloaded_during;
  out["text"] = offload::FormatJointPlan(plan, p);
  return out;
}

// A plan of the race as PlanDict makes it, its text against the units'
// budget it was made for.
py::dict RaceDict(const offload::JointRace& race, const offload::RacePlan& p) {
  offload::JointProblem problem;
  problem.units = race.units();
  problem.budget = p.budget;
  return PlanDict(p.plan, problem);
}

// Trials as (step_ns, peak_bytes, plan dict), as budget.py read them.
py::list TrialList(const offload::JointRace& race,
                   const std::vector<offload::RaceTrial>& trials) {
  py::list out;
  for (const offload::RaceTrial& t : trials) {
    out.append(
        py::make_tuple(t.step_ns, t.peak_bytes, RaceDict(race, t.plan)));
  }
  return out;
}

py::object WarningOf(const offload::RaceStep& step) {
  return step.warning.empty() ? py::object(py::none())
                              : py::object(py::str(step.warning));
}

// A plan LongerBatches made, as PlanDict makes it, with its needs_budget,
// the ratio it is for ("for_ratio") and its number there ("length_id").
py::dict LongerDict(const offload::LongerPlan& p) {
  py::dict out = PlanDict(p.length.plan, p.length.problem);
  out["needs_budget"] = p.length.needs_budget;
  out["for_ratio"] = p.ratio;
  out["length_id"] = p.id;
  return out;
}

py::object LongerOrNone(
    const offload::StatusOr<std::optional<offload::LongerPlan>>& made) {
  const std::optional<offload::LongerPlan> plan = ValueOrThrow(made);
  return plan.has_value() ? py::object(LongerDict(*plan)) : py::object(py::none());
}

void BindLongerBatches(py::module& m) {
  py::class_<offload::LongerBatches>(
      m, "LongerBatches",
      "LongerBatches (engine/plan/longer_batches.h): which plan for batches "
      "longer than the profiled one serves when. Plans are dicts with "
      "needs_budget, for_ratio and length_id (the number the calls below "
      "take); an engine error raises.")
      .def(py::init([](offload::JointRace& race, int checked_steps, int max_rungs) {
             if (checked_steps < 0) {
               throw py::value_error("checked_steps must be at least 0");
             }
             if (max_rungs < 1) throw py::value_error("max_rungs must be at least 1");
             return std::make_unique<offload::LongerBatches>(race, checked_steps, max_rungs);
           }),
           py::keep_alive<1, 2>(), py::arg("race"), py::arg("checked_steps"),
           py::arg("max_rungs") = static_cast<int>(offload::LongerBatches::kMaxRungs))
      .def("for_one_forward",
           [](offload::LongerBatches& l, double ratio) {
             return LongerOrNone(l.ForOneForward(ratio));
           },
           "ForOneForward: in the race, the plan (or None) for this forward's "
           "batch, `ratio` times the profiled one's size",
           py::arg("ratio"))
      .def("race_step_measured",
           [](offload::LongerBatches& l, double ratio, int id,
              int64_t measured_peak_bytes) {
             return ValueOrThrow(l.RaceStepMeasured(ratio, id, measured_peak_bytes));
           },
           "RaceStepMeasured: a race step on a batch `ratio` times the "
           "profiled one's ran plan `id` (0: the race's own) and peaked at "
           "`measured_peak_bytes`; whether the bytes' growth was raised",
           py::arg("ratio"), py::arg("id"), py::arg("measured_peak_bytes"))
      .def("race_saw", &offload::LongerBatches::RaceSaw, py::arg("ratio"))
      .def_property_readonly("seen", &offload::LongerBatches::seen)
      .def_property_readonly("longest", &offload::LongerBatches::longest)
      .def("plan_if_longest",
           [](offload::LongerBatches& l, double ratio) {
             return LongerOrNone(l.Longest(ratio));
           },
           "Longest: after the warm-up, the plan (or None) for a batch "
           "`ratio` times the profiled one's size, where it is the longest yet",
           py::arg("ratio"))
      .def("warm_up_ended",
           [](offload::LongerBatches& l) { return LongerOrNone(l.WarmUpEnded()); })
      .def("for_batch",
           [](offload::LongerBatches& l, double ratio) {
             return LongerOrNone(l.ForBatch(ratio));
           },
           "ForBatch: after the warm-up, the plan for a batch `ratio` times "
           "the profiled one's size whose size is known before its first "
           "unit (None: the race's own plan)",
           py::arg("ratio"))
      .def("for_every_batch",
           [](const offload::LongerBatches& l) {
             const std::optional<offload::LongerPlan> plan = l.ForEveryBatch();
             return plan.has_value() ? py::object(LongerDict(*plan)) : py::object(py::none());
           },
           "ForEveryBatch: the longest rung's plan (None: the race's own plan)")
      .def("rungs",
           [](const offload::LongerBatches& l) {
             py::list out;
             for (const offload::LongerPlan& plan : l.Rungs()) out.append(LongerDict(plan));
             return out;
           },
           "Rungs: the plans for the lengths planned for, shortest first")
      .def("check_begins", &offload::LongerBatches::CheckBegins,
           "CheckBegins: whether a step of plan `in_force` is checked",
           py::arg("in_force"))
      .def("step_checked",
           [](offload::LongerBatches& l, int id, int64_t measured_peak_bytes) {
             offload::LongerBatches::CheckedStep step =
                 ValueOrThrow(l.StepChecked(id, measured_peak_bytes));
             return py::make_tuple(
                 step.plan.has_value() ? py::object(LongerDict(*step.plan))
                                       : py::object(py::none()),
                 step.same, step.dropped);
           },
           "StepChecked: (plan or None, same, dropped)", py::arg("id"),
           py::arg("measured_peak_bytes"))
      .def("out_of_memory",
           [](offload::LongerBatches& l, int failed, int held) {
             offload::LongerBatches::GivingWay way =
                 ValueOrThrow(l.OutOfMemory(failed, held));
             py::dict out;
             out["plan"] = way.plan.has_value() ? py::object(LongerDict(*way.plan))
                                                : py::object(py::none());
             out["again"] = way.again;
             out["first_at_length"] = way.first_at_length;
             out["why"] = way.why.ok() ? py::object(py::none())
                                       : py::object(py::str(way.why.ToString()));
             out["dropped"] = way.dropped;
             return out;
           },
           "OutOfMemory: a dict of plan (or None), again (a length_id or 0), "
           "first_at_length, why (str or None) and dropped",
           py::arg("failed"), py::arg("held"));
}

void BindJointRace(py::module& m) {
  py::class_<offload::JointRace>(
      m, "JointRace",
      "JointRace (engine/plan/joint_race.h): the warm-up race of the budget "
      "mode. start() plans; measured(step_ns, peak) after each measured iteration "
      "returns a warning (str) or None; `plan` is the plan to apply.")
      .def(py::init([](const std::vector<py::dict>& units, double d2h_gbps,
                       double h2d_gbps, int64_t budget, int64_t outside,
                       bool allow_offload, bool allow_recompute,
                       std::vector<int> index, int runs_per_candidate,
                       int checked_iterations, int warmup_iterations,
                       double margin, double prune, int64_t tolerance_bytes,
                       double rematch, int rematch_runs) {
             if (runs_per_candidate < 2) {
               throw py::value_error("runs_per_candidate must be at least 2");
             }
             std::vector<offload::UnitCost> costs;
             for (const py::dict& d : units) costs.push_back(UnitOf(d));
             offload::JointRaceOptions options;
             options.runs_per_candidate = runs_per_candidate;
             options.checked_iterations = checked_iterations;
             options.warmup_iterations = warmup_iterations;
             options.margin = margin;
             options.prune = prune;
             options.tolerance_bytes = tolerance_bytes;
             options.rematch = rematch;
             options.rematch_runs = rematch_runs;
             return std::make_unique<offload::JointRace>(
                 std::move(costs), d2h_gbps, h2d_gbps, budget, outside,
                 allow_offload, allow_recompute, std::move(index), options);
           }),
           py::arg("units"), py::arg("d2h_gbps"), py::arg("h2d_gbps"),
           py::arg("budget"), py::arg("outside"), py::arg("allow_offload"),
           py::arg("allow_recompute"), py::arg("index"),
           py::arg("runs_per_candidate") = 3, py::arg("checked_iterations") = 4,
           py::arg("warmup_iterations") = 24, py::arg("margin") = 0.01,
           py::arg("prune") = offload::JointRaceOptions{}.prune,
           py::arg("tolerance_bytes") = offload::JointRaceOptions{}.tolerance_bytes,
           py::arg("rematch") = offload::JointRaceOptions{}.rematch,
           py::arg("rematch_runs") = offload::JointRaceOptions{}.rematch_runs)
      .def("start", [](offload::JointRace& r) { ThrowIfError(r.Start()); })
      .def("measured",
           [](offload::JointRace& r, double step_ns, int64_t peak_bytes) {
             return WarningOf(r.Measured(step_ns, peak_bytes));
           },
           py::arg("step_ns"), py::arg("peak_bytes"))
      .def("out_of_memory",
           [](offload::JointRace& r, int64_t peak_bytes) {
             return WarningOf(r.OutOfMemory(peak_bytes));
           },
           "OutOfMemory: the plan in force ran out of device memory at "
           "`peak_bytes` above the forward's start; returns a warning or None",
           py::arg("peak_bytes"))
      .def("measuring", &offload::JointRace::Measuring, py::arg("iteration"))
      .def("warm_up_ended", &offload::JointRace::WarmUpEnded,
           py::arg("iteration"))
      .def("settle_on_best", &offload::JointRace::SettleOnBest)
      .def("for_length",
           [](const offload::JointRace& r, double ratio) {
             offload::LengthPlan length =
                 ValueOrThrow(offload::PlanForLength(r, ratio));
             py::dict out = PlanDict(length.plan, length.problem);
             out["needs_budget"] = length.needs_budget;
             return out;
           },
           "PlanForLength (engine/plan/joint_length.h): the plan (dict) for "
           "a batch `ratio` times the profiled one's size, with needs_budget "
           "(0 where it fits the budget)",
           py::arg("ratio"))
      .def_property_readonly("length_exponent", &offload::JointRace::length_exponent)
      .def("calibrate",
           [](offload::JointRace& r, double step_ns,
              const std::vector<std::string>& choice) {
             std::vector<offload::UnitChoice> choices;
             for (const std::string& c : choice) choices.push_back(ChoiceOf(c));
             r.Calibrate(step_ns, choices);
           },
           py::arg("step_ns"), py::arg("choice"))
      .def_property_readonly("plan",
                             [](const offload::JointRace& r) {
                               return RaceDict(r, r.race_plan());
                             })
      .def_property_readonly("units",
                             [](const offload::JointRace& r) {
                               py::list out;
                               for (const offload::UnitCost& u : r.units()) {
                                 out.append(UnitDict(u));
                               }
                               return out;
                             })
      .def_property_readonly("excess",
                             [](const offload::JointRace& r) {
                               return py::make_tuple(r.recompute_excess(),
                                                     r.selective_excess());
                             })
      .def_property_readonly("budget", &offload::JointRace::budget)
      .def_property_readonly("units_budget", &offload::JointRace::units_budget)
      .def_property_readonly("bandwidths", [](const offload::JointRace& r) {
        return py::make_tuple(r.d2h_gbps(), r.h2d_gbps());
      })
      .def_property_readonly("refusal", [](const offload::JointRace& r) {
        return r.refusal().empty() ? py::object(py::none())
                                   : py::object(py::str(r.refusal()));
      })
      .def_property_readonly("candidates", [](const offload::JointRace& r) {
        py::list out;
        for (const offload::RacePlan& p : r.candidates()) {
          out.append(RaceDict(r, p));
        }
        return out;
      })
      .def_property_readonly("trials", [](const offload::JointRace& r) {
        return TrialList(r, r.trials());
      })
      .def_property_readonly("all_trials", [](const offload::JointRace& r) {
        return TrialList(r, r.all_trials());
      })
      .def_property_readonly("settled", &offload::JointRace::settled)
      .def_property_readonly("checks_left", &offload::JointRace::checks_left)
      .def_property("calibrated", &offload::JointRace::calibrated,
                    &offload::JointRace::set_calibrated);
}

}  // namespace

void BindJointPlan(py::module& m) {
  BindJointRace(m);
  BindLongerBatches(m);
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
         int64_t budget, const py::sequence& recompute, bool allow_offload)
          -> py::object {
        const offload::JointProblem p = ProblemOf(
            units, d2h_gbps, h2d_gbps, budget, allow_offload, true);
        offload::StatusOr<offload::JointPlan> plan =
            offload::EvaluateJoint(p, ChoicesOf(recompute));
        if (plan.status().code() == offload::StatusCode::kResourceExhausted) {
          return py::none();
        }
        return PlanDict(ValueOrThrow(std::move(plan)), p);
      },
      "EvaluateJoint: the plan (dict) for the given choice, or None when it "
      "does not fit the budget. `recompute`: per unit a bool (recomputed in "
      "full) or a choice's name (keep, offload, recompute, selective, "
      "selective-offload; keep "
      "and offload follow from the budget)",
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
