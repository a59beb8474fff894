"""The memory budget on batches longer than the one it profiled (SPEC §7.8).

Dynamic padding feeds batches of many lengths; the budget's profile and
race measure the first one's (budget.SHAPE_PATIENCE). A longer batch gets
a plan made for its size: the engine's (_C.JointRace.for_length,
engine/plan/joint_length.h: the race's units and the bytes beside them
grown by the ratio, within the same budget).
  - In the race (the warm-up after the profile), for that batch alone:
    the race's plan and its engine loop come back at the next forward,
    and the batch is not one of the race's measurements. The warm-up's
    end plans for the longest batch it saw.
  - After the warm-up, for a batch longer than every earlier one: its
    length is a rung (LongerBatches::ForBatch), as is a shorter batch's,
    an eighth or more from every shorter length planned for before, where
    a lighter plan than the race's fits it. A
    batch seen at the forward's first call runs the plan of the shortest
    rung at or above it (else the race's own); any other the
    longest rung's, in force at each forward's enter (at_enter), which
    fits every batch. A rung's first CHECKED_ITERATIONS steps at its
    length read their peak (check_begins, _check_length, pass_ended);
    over the budget, the engine fits how the bytes grow with the length
    (PlanForLengthMeasured) and the plan made with that growth takes the
    rung. A step of it out of device memory gives way (out_of_memory).

Where the batch is seen (from the race's start):
  - at the forward's first module call that takes a tensor positionally
    (a Hugging Face model's embedding gets input_ids so, as does a
    torchtune model): a global forward pre-hook, in force from the
    context's enter to that call. Its size against what that call took
    for a batch of the profiled size (read at the first unit, and checked
    there at every forward: a call that does not grow with the batch is
    not hooked again) gives the ratio before any unit has run, and the
    context sets this forward up again under the new plan
    (OffloadActivations._plan_changed). Where that first call is a
    unit's own, its hooks have already been read. No such hook is put
    up where a unit or a module of the model is compiled: under
    torch.compile a hook in force changes what dynamo traces, and a
    model compiled whole ran other kernels (7.0010 for 7.0009: run 96);
  - at the first unit (its input's bytes against the profile's), which
    catches what the first call did not: after the warm-up, the plan
    then starts with the next forward; in the race, the batch runs the
    race's plan, and counts for the warm-up's end.
Where no plan fits the budget at that size, a warning names the least
budget that does, and the plan for it runs.
"""

import threading
import warnings

import torch

from . import _common, recompute
from .budget_units import plan_key, schedule_for


class LongerBatches:
    """The glue of a JointBudget (`budget`) to the engine's LongerBatches
    (_C.LongerBatches, engine/plan/longer_batches.h), which decides which
    plan for longer batches serves when: here the batches are seen, the
    checked steps' peaks read, the plans applied and the warnings said."""

    def __init__(self, budget):
        self.budget = budget
        self._engine = None   # _C.LongerBatches, once the race is made
        self._said = set()    # length_id of the plans whose needs_budget was warned about
        self._pending = None  # a plan made for it, not yet in force
        self._for_one = False  # whether the pending plan is for this forward alone (the race)
        self._handle = None   # the first-call hook, while it waits
        self._changed = None  # what the context does when the plan changes now
        self._thread = None   # the thread whose forward the hook waits for
        self._first = None    # the size the first call took in this forward
        # What the first call takes for a batch of the profiled size: None
        # until the first unit tells; False where the first call does not
        # grow with the batch (it is not hooked again).
        self._reference = None
        self._compiled = None   # whether a unit or a module of the model is compiled
        self._checking = None   # this forward's: [plan, allocated at its start, whether begun]
        self._ratio = None  # this forward's batch to the profiled one, once its first unit began
        self._every = 0     # length_id of the plan for every batch last put in force (0: the race's)
        self._switched = False  # whether a forward's first call put its batch's plan in force

    def race_started(self, race):
        """The budget's race (_C.JointRace) started: the engine's
        LongerBatches plans with it from now on."""
        from .budget import CHECKED_ITERATIONS, LENGTH_RUNGS
        self._engine = _common.ext().LongerBatches(race, CHECKED_ITERATIONS, LENGTH_RUNGS)

    @property
    def seen(self):
        """The longest batch the race saw, to the profiled one."""
        return 1.0 if self._engine is None else self._engine.seen

    @property
    def longest(self):
        """The longest batch planned for after the warm-up, to the profiled one."""
        return 1.0 if self._engine is None else self._engine.longest

    @staticmethod
    def _id(plan):
        """The engine's number of a plan it made for longer batches, else 0."""
        return 0 if plan is None else plan.get("length_id", 0)

    def pending_is_lean(self):
        """Whether the pending plan runs without the engine (budget.LEAN)."""
        return self._pending is not None and self.budget.runs_lean(self._pending)

    def take_pending(self):
        """(plan, for this forward alone): the plan made for a longer batch
        and not yet applied, or (None, False)."""
        plan, self._pending = self._pending, None
        return plan, self._for_one

    # --- the forward's first call -------------------------------------------------
    def watch(self, changed):
        """At the context's enter, from the race's start: hooks the
        forward's first module call. `changed()` sets the forward up again
        where a new plan is pending, and says whether it could (else, after
        the warm-up, the plan stays pending for the next forward)."""
        self.unwatch()
        self._first = self._ratio = None
        if self._profiled() is None or self._reference is False:
            return
        if self._compiled is None:  # the model's modules (where given) and the units
            self._compiled = any(recompute.compiled(m)
                                 for root in self.budget.owner.model_modules() + self.budget.units
                                 for m in root.modules())
        if self._compiled:
            return
        self._changed = changed
        self._thread = threading.get_ident()
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(
            _common.eagerly(self._first_call))

    def unwatch(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _first_call(self, module, args):
        if threading.get_ident() != self._thread:
            return None  # a global hook: another thread's module (an evaluation's)
        tensor = _common.first_tensor(args)
        if tensor is None or _common.in_backward():
            return None  # a call by keywords only: the next one is looked at
        self.unwatch()
        self._first = tensor.numel()
        if not self._reference:
            return None
        ratio = self._first / self._reference
        racing = self.budget.measuring
        if not (self._plan_for_one(ratio) if racing else self._plan_for_batch(ratio)):
            return None
        if any(module is unit for unit in self.budget.units) or not self._changed():
            # Its hooks are read already, or the forward cannot be set up
            # again: the plan in force (after the warm-up, the one for every
            # batch, at_enter) runs it. A plan for a longer batch made now
            # is in force from the next forward on (at_enter).
            self._pending = None
        elif not racing:
            self._switched = True  # (the next forward's enter puts the plan for every batch back)
            self.check_begins()  # the new plan runs this forward: its peak is read
        return None

    # --- the first unit -----------------------------------------------------------
    def at_first_unit(self, args, kwargs):
        """The first unit begins, from the race's start: its input against
        the profile's, and against what the first call took."""
        tensor = _common.first_tensor(args, kwargs)
        profiled = self._profiled()
        if tensor is None or not profiled:
            return
        ratio = self._ratio = _common.tensor_bytes(tensor) / profiled
        if self._first and self._reference is not False:
            reference = self._first / ratio
            if self._reference is None:
                self._reference = reference
            elif abs(reference - self._reference) > 1e-6 * self._reference:
                self._reference = False  # the first call does not grow with the batch
        if self._checking is not None:
            self._check_length(ratio)
        if self.budget.measuring:
            self._engine.race_saw(ratio)
        else:  # a batch longer than any before has a plan from the next forward on
            self._made(lambda engine: engine.for_batch(ratio), "every batch from now on runs",
                       ratio)

    def race_step_ended(self, record):
        """In the race, a step whose batch had another length than the
        profiled one ended (`record`, budget_record's): a longer batch's
        peak against the budget (LongerBatches::RaceStepMeasured). Over it,
        the engine fits how the bytes grow with the batch, and the plans for
        longer batches made from then on (this race's, the warm-up's end's)
        grow so."""
        profiled = self._profiled()
        if not profiled or not record["input"][0] or record.get("peak") is None:
            return  # (a first unit called without a tensor is not compared)
        ratio = record["input"][0] / profiled
        plan = record.get("length_id", 0)  # the plan made for it (Interim), or the race's own
        if not plan and record["choice"] != self.budget._race.plan["choice"]:
            return  # a plan the race has left since ran
        try:
            self._engine.race_step_measured(ratio, plan, record["peak"])
        except (RuntimeError, ValueError) as error:  # the engine's Status
            warnings.warn(f"actoffload: a step on a batch {ratio:.2f} times the profiled "
                          f"one's size in the warm-up peaked at {record['peak']} bytes, and "
                          f"the engine could not fit its growth ({error})", stacklevel=2)

    def warm_up_ended(self):
        """After the warm-up: plans for the longest batch the race saw (at
        the first forward after it; at_enter puts it in force)."""
        if self._profiled() is not None:
            self._made(lambda engine: engine.warm_up_ended(), "every batch from now on runs")

    def rungs(self):
        """The plans for the lengths planned for after the warm-up
        (LongerBatches::Rungs), shortest first."""
        return [] if self._engine is None else self._engine.rungs()

    def at_enter(self):
        """At a forward after the warm-up, before anything of it is set
        up: the plan for every batch (the longest rung's, or the race's own
        where there is none) is put in force where the last forward's first
        call put a shorter batch's in force, or where it is a new one (a
        longer batch's, seen at its first unit). This forward's first call
        may put its own batch's in force (_first_call); a forward whose
        size is not known in time runs this one, which fits it."""
        plan = None if self._engine is None else self._engine.for_every_batch()
        if not self._switched and self._id(plan) == self._every:
            return  # (what is in force stays: a plan given way to, say)
        self._switched, self._every = False, self._id(plan)
        plan = plan if plan is not None else self.budget._race.plan
        if not self._same(plan, self.budget.plan):
            self.budget._apply(plan)

    # --- planning -----------------------------------------------------------------
    def _profiled(self):
        """The first unit's input bytes in the profile, or None before the
        race's start."""
        budget = self.budget
        if self._engine is None or not budget._profiles:
            return None
        return budget._profiles[0]["input"][0]

    def _plan_for_batch(self, ratio):
        """After the warm-up, at the forward's first call: the plan for a
        batch `ratio` times the profiled one's size (the engine's:
        LongerBatches::ForBatch, the shortest rung at or above it, made
        where it is the longest yet or a shorter length an eighth from every
        one planned for before; the race's own for the
        profiled length, and for a shorter one with no rung at or above it
        below that). Whether it is now pending: where it runs as the plan
        in force does, only its figures change."""
        plan = self._made(lambda engine: engine.for_batch(ratio),
                          "every batch from now on runs", ratio, failed=False)
        if plan is False:
            return False  # (warned) the plan in force, for every batch, runs it
        if self._id(plan) == self._every:
            return False  # the plan for every batch, which at_enter left in force
        if plan is None:
            plan = self.budget._race.plan  # the profiled length's, and shorter ones'
        if self._same(plan, self.budget.plan):
            return False
        if self.budget.same_plan(plan, self.budget.plan):
            self.budget._apply(plan)  # the same choices and schedule: only its figures change
            return False
        self._pending, self._for_one = plan, False
        return True

    def _same(self, a, b):
        """Whether plans `a` and `b` are one: the same plan for longer
        batches (length_id), or both the race's, running alike."""
        if a is b:
            return True
        if a is None or b is None or self._id(a) != self._id(b):
            return False
        return self._id(a) != 0 or self.budget.same_plan(a, b)

    def _plan_for_one(self, ratio):
        """In the race: the plan for this forward's batch, `ratio` times
        the profiled one's size (the engine's: the plan for the longest
        batch the race has seen, which fits every shorter one), where the
        race's plan is not it; whether a plan for it alone is now pending."""
        plan = self._made(lambda engine: engine.for_one_forward(ratio),
                          "batches longer than the profiled one run", ratio)
        if plan is None or self.budget.same_plan(plan, self.budget.plan):
            return False
        self._pending, self._for_one = plan, True
        return True

    def _made(self, make, then, ratio=None, failed=None):
        """The engine's plan `make(engine)` (or None), warned about once
        where it needs a larger budget (`then` says what runs) or where it
        failed (then `failed` comes back)."""
        try:
            plan = make(self._engine)
        except (RuntimeError, ValueError) as error:  # the engine's Status
            warnings.warn(f"actoffload: no plan for a batch {ratio or self._engine.seen:.2f} "
                          f"times the profiled one's size ({error}); the plan in force runs",
                          stacklevel=5)
            return failed
        if plan is not None and plan["needs_budget"] and plan["length_id"] not in self._said:
            self._said.add(plan["length_id"])
            warnings.warn(
                f"actoffload: a batch {plan['for_ratio']:.2f} times the profiled one's size "
                f"needs a budget of at least {plan['needs_budget']} bytes, and the budget is "
                f"{self.budget.budget_bytes}; {then} the plan for that least budget",
                stacklevel=5)
        return plan

    def ran_longer(self, plan):
        """Whether the last forward's batch was longer than `plan` (which
        it ran) was made for: its size was not known before its first unit,
        and the plan for it came after (its step out of memory blames no
        plan: budget_edge.steady_out_of_memory)."""
        made_for = plan.get("for_ratio", 1.0)
        return self._ratio is not None and self._ratio > made_for * (1 + 1e-6)

    def out_of_memory(self, failed, watch):
        """After the warm-up, a step of `failed`, a plan for longer batches,
        ran out of device memory. The engine says what serves now
        (LongerBatches::OutOfMemory): the plan for that length predicted
        below it (later plans for longer batches are made within that
        too); else the plan the last step whose backward ended
        (watch.held, a SteadyWatch) ran, where another plan for that length
        ran a whole step since its first error there (before it, the device
        held more: GPU run 136); else `failed` runs on. Each is warned about."""
        way = self._engine.out_of_memory(self._id(failed), self._id(watch.held))
        if way["first_at_length"]:
            watch.held = None  # a step that ran before it ran on more memory
        ratio = failed["for_ratio"]
        said = (f"actoffload: a step of the plan for batches {ratio:.2f} times the "
                "profiled one's size ran out of device memory after the warm-up")
        if way["dropped"]:  # a shorter batch's: from the next forward, the plan above it
            warnings.warn(f"{said}; they run the plan for the next longer length from now on",
                          stacklevel=5)
            return
        plan = way["plan"]
        if plan is not None:
            self._said.add(plan["length_id"])  # (its needs_budget is not said again)
            warnings.warn(
                f"{said}: the device cannot hold that plan; they run one predicted to "
                f"peak at {plan['peak_bytes']} bytes in the units, for "
                f"{failed['peak_bytes']}", stacklevel=5)
            self.budget._apply(plan)
            return
        why = (f"no plan for them is predicted to hold less ({way['why']})" if way["why"]
               else "the plan predicted to hold less ran out of memory before")
        if way["again"]:
            warnings.warn(f"{said}, and {why}; the last plan a whole step of theirs ran "
                          "with runs again", stacklevel=5)
            self.budget._apply(watch.held)
            return
        warnings.warn(f"{said}, and {why}; it runs on: shorter batches would fit",
                      stacklevel=5)

    # --- checking a plan for longer batches -----------------------------------------
    def check_begins(self):
        """At a forward after the warm-up (or where a plan for a longer
        batch is put in force before its first unit): where the engine
        checks the plan in force (its first budget.CHECKED_ITERATIONS steps
        at its length: nothing else measured it), what is allocated now is
        the step's base; its peak is read from the first unit on, where the
        batch is the plan's length (_check_length)."""
        self._checking = None
        if self._engine is None or not self._engine.check_begins(self._id(self.budget.plan)):
            return
        self._checking = [self.budget.plan, self.budget.probe.allocated(), False]

    def _check_length(self, ratio):
        """The first unit of a checked forward begins on a batch `ratio`
        times the profiled one's size: where that is its plan's length, the
        allocator's peak counter is reset (as in the race's measured steps)
        and the step counts; else it is not checked. (Steps of other lengths
        leave the counter the caller may read alone.)"""
        plan = self._checking[0]
        if abs(ratio - plan["for_ratio"]) > 1e-6 * plan["for_ratio"]:
            self._checking = None
            return
        self.budget.probe.reset_peak()
        self._checking[2] = True

    def pass_ended(self, plan):
        """The backward of a step of `plan` ended (budget_edge.SteadyWatch):
        where it was a checked step on a batch of the plan's length, its
        peak goes to the engine (LongerBatches::StepChecked). Over the
        budget (or the least budget the plan was said to need), the units'
        bytes grew faster with the batch than the model took them to (eager
        attention's scores grow as the square of the tokens): the engine
        fits that growth (JointRace::length_exponent) and the plan it makes
        for that length with it serves from then on, warned about, checked
        in turn. Where that is the same plan, choices and schedule (none
        holds less), its figures change, a warning names the least budget
        it holds at that growth, and the checks end."""
        checking, self._checking = self._checking, None
        if checking is None or not checking[2] or checking[0] is not plan \
                or self._engine is None or not self._engine.check_begins(self._id(plan)):
            return  # not a checked step of this plan on a batch of its length
        ratio = plan["for_ratio"]
        budget = self.budget
        peak = budget.probe.peak() - checking[1]
        try:
            lower, same, dropped = self._engine.step_checked(self._id(plan), peak)
        except (RuntimeError, ValueError) as error:  # the engine's Status
            warnings.warn(f"actoffload: no plan for batches {ratio:.2f} times the profiled "
                          f"one's size after a step of theirs peaked at {peak} bytes ({error}); "
                          "the plan in force runs on", stacklevel=2)
            return
        if dropped:  # a shorter batch's lighter plan: from the next forward, the one above it
            warnings.warn(
                f"actoffload: a step of the lighter plan for batches {ratio:.2f} times the "
                f"profiled one's size peaked at {peak} bytes above the forward's start, over "
                f"the budget of {budget.budget_bytes}; they run the plan for the next longer "
                "length from now on", stacklevel=2)
            return
        if lower is None:  # it holds
            return
        self._said.add(lower["length_id"])  # (said here: not again when it serves)
        said = (f"actoffload: a step of the plan for batches {ratio:.2f} times the profiled "
                f"one's size peaked at {peak} bytes above the forward's start, over the "
                f"budget of {max(budget.budget_bytes, plan['needs_budget'])} (its units were "
                f"predicted at {plan['peak_bytes']} bytes): their bytes grow as the batch's "
                f"size to the power {budget._race.length_exponent:.2f}")
        needs = (f"; no plan holds the budget at that growth, and the least budget that "
                 f"does is {lower['needs_budget']} bytes" if lower["needs_budget"] else "")
        if same:
            warnings.warn(f"{said}, and no plan for them is predicted to hold less{needs}; "
                          "it runs on", stacklevel=2)
        else:
            warnings.warn(f"{said}; they run a plan made for that, predicted at "
                          f"{lower['peak_bytes']} bytes{needs}", stacklevel=2)
        budget._apply(lower)


class Interim:
    """In the race, a plan made for one longer batch (LongerBatches) runs
    that forward alone, not measured. The race's plan and its engine loop
    come back at the next forward: the same loop, whose host buffers are
    made, so the race's timings of it are not disturbed. The loop made for
    such a batch serves the next like it, and the plan with its choices and
    schedule when that one is put in force (take_loop)."""

    def __init__(self, budget):
        self.budget = budget
        self._saved = None  # the race's (plan, loop), while a longer batch runs its own
        self._loop = None   # (plan_key, loop): the engine's loop for those batches

    def begin(self, plan):
        """Before the forward's first unit: `plan` runs this forward."""
        b = self.budget
        self._saved = (b.plan, b.owner.offloader)
        b._record["for_one"] = True
        b._record["length_id"] = plan["length_id"]
        b.plan = plan
        key = plan_key(plan, b._index)
        if self._loop is None or self._loop[0] != key:
            self.retire()
            self._loop = (key, b.make_loop(schedule_for(plan, b._index)))
        b.owner.offloader = self._loop[1]

    def end(self):
        """The race's plan and loop, in force again."""
        if self._saved is not None:
            b = self.budget
            b.plan, b.owner.offloader = self._saved
            self._saved = None

    def take_loop(self, plan):
        """The loop a longer batch ran `plan` with (its host buffers are
        made), handed over once; else None."""
        if self._loop is not None and self._loop[0] == plan_key(plan, self.budget._index):
            loop, self._loop = self._loop[1], None
            return loop
        return None

    def retire(self):
        """The loop made for longer batches retires (the warm-up is over,
        or a batch needs a plan with other choices or schedule)."""
        if self._loop is not None:
            self.budget._retired.append(self._loop[1])
            self._loop = None
