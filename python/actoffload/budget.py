"""A memory budget as the user measures it, planned jointly: per unit (a
decoder layer, or its attention and MLP blocks) keep, offload or recompute
(SPEC §4.8, §7.8). Used by OffloadActivations(model, budget_bytes=...).

    ctx = actoffload.OffloadActivations(model, budget_bytes=20 << 30)
    for batch in data:
        with ctx:
            loss = model(**batch).loss
        loss.backward()

The budget bounds the step's peak as the user reads it: the step's
torch.cuda.max_memory_allocated() above torch.cuda.memory_allocated()
before the forward. Its life:
  1. Profile (the first iteration; nothing offloaded or recomputed): per
     unit, the bytes it leaves allocated (the allocator's own count before
     and after its forward), its input's bytes, the peak of its forward and
     of its backward above what the model already counts (its transients:
     eager attention's scores, the gradients its backward computes), its
     forward and backward times (CUDA events; units of one structure share
     their medians, budget_profile.share_times). What stays beside the units
     throughout (embeddings' output, the head's gradients) comes off the
     budget; the head's peak (the logits, the loss and their backward) is
     one more unit, never offloaded or recomputed. To read each stretch's
     peak, the profile iteration resets the allocator's peak counter at
     unit boundaries: its own max_memory_allocated() is the last stretch's.
     Where the torch version has selective-checkpoint policies, a second
     profile iteration runs every recomputable unit selectively
     (recompute.py): the bytes each then saves and the time its backward
     gains are its figures for the fourth choice, "selective", and the
     fifth, "selective-offload" (selective, its saved outputs offloaded).
     Where recompute is allowed, a last profile iteration recomputes every
     unit in full: what each unit's forward then holds while it runs (its
     intermediates, none saved) is its recompute_forward_transient_bytes.
     Where the device cannot hold the kept or selective iteration's step,
     it runs in windows, the units after each recomputed, and one record
     is stitched from them (budget_windows.py).
  2. Plan: the engine's joint planner (_C.plan_joint, engine/plan/joint_plan.h)
     with the copy bandwidths measured on this machine. A budget no plan
     fits is refused once (ValueError at the next forward, naming the
     smallest that fits) and the smallest is planned instead. So is one
     that no plan the warm-up runs keeps as measured (JointRace).
  3. Run: recomputed units run under torch.utils.checkpoint (non-reentrant,
     RNG state preserved); offloaded units are the engine's layers, with a
     schedule table (SPEC §4.2) releasing and reloading them where the
     plan's model does; a selective-offload unit is both (recompute.py
     hands the outputs its checkpoint saves to the engine's loop).
  4. Warm up: the joint plan and, as candidates, the recompute-only and
     offload-only plans and checkpointing's own choice for the same budget
     (those the model predicts more than PRUNE slower left out) each run
     RUNS_PER_CANDIDATE times (the first allocates pinned buffers and does
     not count); the fastest whose peak fits is kept, and its peak is
     checked in the next CHECKED_ITERATIONS. Where none fits, the units'
     share is lowered by the least excess and planned anew (and
     where it cannot be, recompute-only for its smallest budget is tried
     last); where a faster plan measured over, plans like it are made for
     its predicted peak less its excess and raced against those that fit.
     Before it settles, trials the model predicts faster than the one to
     keep, measured up to REMATCH slower, run again in turn with it.
     The race is the engine's (_C.JointRace, engine/plan/joint_race.h):
     this module reports each measured step and peak and applies the plan
     it says.
  5. Steady state: a plan that offloads nothing runs without the engine
     (LEAN). A batch longer than any before it gets a plan made for its
     length, whose first steps at that length are checked; a batch whose
     size is known before its first unit runs the plan for the shortest
     length planned at or above it, each plan with its own engine loop
     (budget_lengths.py).
     A step that ran out of device memory, in a loop that caught it, gives
     way to a plan predicted lower (budget_edge.py, SPEC §7.9).
This module is glue: it measures (budget_record.py) and applies; the engine plans.
"""

import warnings

import torch

from . import (_common, budget_edge, budget_lengths, budget_profile, budget_race,
               budget_record, budget_report, budget_windows, recompute)
from .budget_units import OFFLOADED, find_units, plan_key, schedule_for  # noqa: F401
from .probe import MemoryProbe, copy_bandwidths, default_probe  # noqa: F401

# The race's options (engine/plan/joint_race.h: JointRaceOptions), passed to it.
# The most measured iterations after the profile: each candidate plan runs
# RUNS_PER_CANDIDATE times (measured step and peak), then the fastest that
# fits is kept, its peak checked and the plan lowered where it is over; a
# faster plan measured over the budget races plans like it made for less
# (JointRaceOptions::worth_lowering): room for two such races.
WARMUP_ITERATIONS = 40
# Each candidate runs this often; the first run (pinned buffers allocated)
# does not count, the least step and the highest peak of the others do.
RUNS_PER_CANDIDATE = 3
# The kept plan's peak is checked in this many iterations after warm-up.
CHECKED_ITERATIONS = 4
# After the warm-up, the most lengths with a plan (and an engine loop, with
# its host buffers) of their own (LongerBatches' rungs): lengths that grow
# step by step (a sequence-length warm-up) would make one per length.
LENGTH_RUNGS = 4
# The plan leaves this share of the budget spare (allocator rounding).
_MARGIN = 0.01
# A measured peak fits within one allocator block above the budget
# (probe.granularity), but never more than this share of it (SPEC §7.8's
# +2%): on a 71 MB budget one 2 MiB block is 2.9%, and a Mixtral plan kept
# at 72.9 MB was over (test_gpu_models.py).
_TOLERANCE = 0.02
# A candidate the model predicts slower than the joint plan, or than the
# fastest trial that fits, by more than this share is not run
# (JointRaceOptions::prune).
PRUNE = 0.15
# Before the race settles, the trials the model predicts faster than the one
# it would keep, measured at most this share slower, run REMATCH_RUNS times
# more each (the first not counted), in turn with it; each keeps its least
# step (JointRaceOptions::rematch). A step measured slow for reasons of the
# moment otherwise stays: on an H200 the race measured a plan at 61.3 ms
# that ran 51.6 ms after it, and kept one of 54.0 (run 108).
REMATCH = 0.2
REMATCH_RUNS = 2
# The profile and the race compare like with like: an iteration whose units
# took inputs of other sizes than in the first profile iteration (a batch of
# another length: dynamic padding) is not measured. Its peak and step belong
# to another workload: with them, a Llama h2048 at 0.5 on lengths 1024 to
# 3072 had its budget refused and then raised to 0.63 of the peak, where at
# one length it is refused for 0.59 (run 88). A profile iteration of
# another length is made again, at most this many times in all; after that
# the profile goes on without the kinds it still lacks. The race does not
# count such iterations, up to WARMUP_ITERATIONS of them.
SHAPE_PATIENCE = 8
# After the warm-up, a plan that offloads nothing runs without the engine:
# no saved-tensor hooks (each saved tensor would cross into the engine and
# back for nothing), no unit hooks; only its recomputed units' wrappers.
LEAN = True


class JointBudget(budget_race.RaceView):
    """The profile, plan and calibration of OffloadActivations' budget mode.
    `owner` is the OffloadActivations: its `offloader` (the engine's
    TrainingLoop) is replaced when a plan is applied."""

    def __init__(self, owner, units, budget_bytes, budget_fraction, probe,
                 allow_offload, allow_recompute, bandwidths, make_loop):
        self.owner = owner
        self.units = units
        self._budget_bytes = budget_bytes  # the race's, once it is made
        self.budget_fraction = budget_fraction
        self.probe = probe
        self.allow_offload = allow_offload
        self.allow_recompute = allow_recompute
        self._bandwidths = bandwidths  # the race's, once it is made
        self.make_loop = make_loop
        self.iteration = 0  # forwards begun
        self.plan = None    # the engine's plan dict, once made
        self.profile = None
        self.peaks = []     # measured peak above the forward's start, per iteration
        self.refusal = None  # to raise at the next forward
        self._refused = False  # whether the race's refusal was taken
        self.gave_way = False  # whether a race's plan ran out of memory (budget_edge)
        self._race = None   # _C.JointRace, made after the profile
        self._index = []     # each unit's place in the plan's units
        self._retired = []  # loops whose graphs may still be alive
        self._loops = {}    # plan_key -> loop, for the plans that may serve again (_serving)
        self._forwards = recompute.UnitForwards(self, units)  # how the units run
        self._record = None  # this iteration's measurements while measuring
        self._profiles = []  # the profile iterations' records (_profile_kinds)
        self._windows = budget_windows.Windows()  # the kind being profiled, where it runs windows
        self._steady = budget_edge.SteadyWatch(  # steps out of memory after the warm-up
            probe, ended=lambda plan: self.lengths.pass_ended(plan))
        self._recorder = budget_record.Recorder(probe)  # fills _record
        self._not_rerun = set()  # units that cannot be re-run (_recomputable)
        self._left_out = set()  # profile kinds that ran out of device memory
        self._other_shapes = 0  # iterations not measured: other input sizes (SHAPE_PATIENCE)
        self.lengths = budget_lengths.LongerBatches(self)  # batches longer than profiled
        self._interim = budget_lengths.Interim(self)  # a longer batch's plan in the race

    # --- the iteration's measurements ----------------------------------------
    @property
    def measuring(self):
        if self._race is None:
            return self.iteration <= WARMUP_ITERATIONS + 1
        return self._race.measuring(self._race_iteration)

    @property
    def _race_iteration(self):
        """The race's count of iterations: those of other input sizes than
        the profile's do not count (SHAPE_PATIENCE), up to WARMUP_ITERATIONS."""
        return self.iteration - min(self._other_shapes, WARMUP_ITERATIONS)

    def begin_forward(self):
        """At the context's enter: raises a refusal once (SPEC §7.8); starts
        measuring in the profile and warm-up iterations."""
        if self.refusal is not None:
            message, self.refusal = self.refusal, None
            raise ValueError(message)
        self._interim.end()
        budget_edge.after_out_of_memory(self)
        self.apply_pending()
        self.iteration += 1
        # A steady step that failed gives way first: the race may then
        # measure again (where the warm-up's iterations are not spent).
        failed = self._steady.forward_begins() if self._race is not None else None
        if failed is not None:
            budget_edge.steady_out_of_memory(self, failed)
        if not self.measuring:
            if self._race is not None and self._race.warm_up_ended(self._race_iteration):
                self._take_refusal()  # nothing measured fitted
                self._apply(self._race.plan)  # the warm-up's end came mid-race
            self.lengths.warm_up_ended()  # the longest batch the race saw
            self.apply_pending()
            self.lengths.at_enter()  # the plan for every batch (a shorter one's came at its first call)
            self.lengths.check_begins()  # a plan for longer batches, not yet measured
            self._interim.retire()
            self._record = None
            return
        self._steady.forget()
        self._record = self._recorder.begin(self.units, profile=self.plan is None)
        self._record["choice"] = None if self.plan is None else self.plan["choice"]

    def lean(self):
        """After begin_forward: whether this forward needs nothing of the
        engine (LEAN): not measured, and the plan offloads no unit."""
        return self.plan is not None and self._record is None and self.runs_lean(self.plan)

    @staticmethod
    def runs_lean(plan):
        """Whether a forward of `plan` runs without the engine once settled
        (LEAN): it offloads no unit."""
        return LEAN and not any(c in OFFLOADED for c in plan["choice"])

    def unit_begins(self, index, args, kwargs):
        if index == 0:
            self.lengths.at_first_unit(args, kwargs)
        if self._record is not None and not self._recorder.unit_begins(
                self._record, index, self.units[index], args, kwargs):
            self._not_rerun.add(index)

    def unit_ends(self, index, output):
        if self._record is None and index == 0 and self.plan is not None:
            self._steady.first_unit_ends(output, self.plan)  # the pass's end, watched
        if self._record is not None and not self._recorder.unit_ends(
                self._record, index, self.units[index], output, self.backward_begins):
            self._not_rerun.add(index)
        if self._record is not None and self._record["profile"]:
            later = self._windows.unit_ended(self._record, index, self._recomputable)
            if later:  # the window ends: they run before they are called
                self._forwards.also(later, "recompute")

    def backward_begins(self, record, index):
        if self._recorder.backward_begins(record, index):
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: self._pass_ended(record))

    def _pass_ended(self, record):
        self.peaks.append(self._recorder.pass_ends(record))
        missing = [i for i, end in enumerate(record["fwd_end"]) if end is None]
        if record["profile"] and missing:
            # A unit that did not run (a skipped layer) has nothing to plan
            # with: the next iteration profiles again.
            warnings.warn(f"actoffload: unit {missing[0]} did not run in the profile "
                          f"iteration's forward; profiling again", stacklevel=2)
            return
        first = (self._profiles or self._windows.records or [None])[0]
        other_shape = first is not None and record["input"] != first["input"]
        if record["profile"]:
            if other_shape:
                self._other_shapes += 1
                if self._other_shapes < SHAPE_PATIENCE or not self._profiles:
                    return  # this kind is profiled again (the plan needs the kept one)
                warnings.warn(
                    f"actoffload: the budget's profile saw {self._other_shapes} batches of "
                    "other lengths than its first; it goes on without its "
                    f"{' and '.join(self._profile_kinds()[len(self._profiles):])} iteration "
                    "(pad batches to a few lengths: plans are measured on one)",
                    stacklevel=2)
            else:
                if not self._windows.ended(record, self._eligible(self._profiling())):
                    return  # the next iteration's window goes on (budget_windows)
                records, ran = self._windows.take()
                self._profiles.append(budget_profile.stitch(
                    records, ran, record["kind"], self._recorder.clock))
                if len(self._profiles) < len(self._profile_kinds()):
                    return  # the next iteration profiles the next kind
            self._make_profile(*self._profiles)
            self._start_race()
        elif record.get("for_one") or (other_shape and self._other_shapes < WARMUP_ITERATIONS):
            # A plan made for this batch alone ran (budget_lengths.Interim), or the
            # race's on another length: the race waits for a like batch. A
            # longer batch's peak shows how the bytes grow with it.
            self._other_shapes += 1
            self.lengths.race_step_ended(record)
        elif self.plan is not None:
            if record["choice"] != self._race.plan["choice"]:
                # A forward of a plan the race has left since: several
                # forwards before one backward, the first one's end made
                # the race move on (its measurement is not the new plan's).
                return
            step = self._recorder.step_ns(record)
            warning = self._race.measured(step, record["peak"])
            if warning is not None:
                warnings.warn(warning, stacklevel=2)
            self._take_refusal()
            self._apply(self._race.plan)

    def forward_raised(self):
        """At the context's exit by an exception: a measured forward reads
        the allocator's peak (what an out-of-memory error held)."""
        if self._record is not None:
            self._recorder.forward_raised(self._record)
        elif self.plan is not None:
            self._steady.forward_raised(self.plan)

    # --- profile, plan, calibration ---------------------------------------------
    def _recomputable(self, index):
        """Whether unit `index` may be re-run from its input: recompute is
        allowed and its forward was not seen to modify an input in place
        (a block beginning with `x.relu_()`): re-run from the modified
        input, it would compute something else, and torch ≥ 2's checkpoint
        refuses it in the backward ("modified by an inplace operation");
        nor its own buffers (BatchNorm's running statistics in training):
        a re-run would update them twice a step; and none of its arguments
        is an inference tensor (a mask made under `torch.inference_mode`):
        torch ≥ 2's checkpoint saves the inputs for backward, which
        autograd refuses for an inference tensor."""
        return self.allow_recompute and index not in self._not_rerun

    def _selective_allowed(self, index):
        return (self._recomputable(index) and recompute.selective_available()
                and not recompute.compiled(self.units[index]))

    def _profile_kinds(self):
        """The profile iterations, in order: "all" (every unit kept), then,
        where allowed, "selective" (every unit that may be, selectively)
        and "recompute" (every unit recomputed in full: what its forward
        holds while it runs), but for those that ran out of device memory
        (budget_edge.after_out_of_memory)."""
        kinds = ["all"]
        if any(self._selective_allowed(i) for i in range(len(self.units))):
            kinds.append("selective")
        if any(self._recomputable(i) for i in range(len(self.units))):
            kinds.append("recompute")
        return [kind for kind in kinds if kind not in self._left_out]

    def _eligible(self, kind):
        """Per unit, whether a profile iteration of `kind` measures it."""
        return budget_windows.eligible(kind, [self._selective_allowed(i)
                                              for i in range(len(self.units))])

    def _profiling(self):
        """The kind of profile iteration this forward is, or None once planned."""
        if self.plan is not None:
            return None
        kinds = self._profile_kinds()
        return kinds[min(len(self._profiles), len(kinds) - 1)]

    def _make_profile(self, *records):
        n = len(self.units)
        by_kind = dict(zip(self._profile_kinds(), records))
        r, selective = by_kind["all"], by_kind.get("selective")
        self.profile, self._index = budget_profile.make_profile(
            r, selective, self._recorder.clock,
            selective=[self._selective_allowed(i) for i in range(n)],
            kinds=[budget_profile.unit_kind(u) for u in self.units],
            recompute_record=by_kind.get("recompute"),
            compiled=[recompute.compiled(u) for u in self.units],
            recomputable=[self._recomputable(i) for i in range(n)])
        if self._budget_bytes is None:
            self._budget_bytes = int(self.budget_fraction * r["peak"])

    def _start_race(self):
        """The engine's race for the profile: its first plan applied (the
        smallest that fits where the budget is refused: raised at the next
        forward)."""
        d2h, h2d = self._bandwidths
        self._race = _common.ext().JointRace(
            self.profile["units"], d2h, h2d, self._budget_bytes,
            self.profile["outside"], self.allow_offload, self.allow_recompute,
            self._index, runs_per_candidate=RUNS_PER_CANDIDATE,
            checked_iterations=CHECKED_ITERATIONS,
            warmup_iterations=WARMUP_ITERATIONS, margin=_MARGIN, prune=PRUNE,
            rematch=REMATCH, rematch_runs=REMATCH_RUNS,
            tolerance_bytes=min(getattr(self.probe, "granularity", 0),
                                int(_TOLERANCE * self._budget_bytes)))
        self._race.start()
        self.lengths.race_started(self._race)
        self._take_refusal()
        self._apply(self._race.plan)

    def _take_refusal(self):
        """The race's refusal, raised once at the next forward (SPEC §7.8):
        made at the start (no plan fits the model), or when no plan the
        warm-up ran fits as measured; once a plan of the race ran out of
        device memory (SPEC §7.9: the device, not the budget asked for, is
        what no plan fits), a warning instead."""
        if self._race.refusal is not None and not self._refused:
            self._refused = True
            if self.gave_way:
                warnings.warn(self._race.refusal, stacklevel=4)
            else:
                self.refusal = self._race.refusal

    def apply_pending(self):
        """Puts a plan made for a longer batch in force (budget_lengths)."""
        plan, for_one = self.lengths.take_pending()
        if plan is None:
            return
        if for_one:
            self._interim.begin(plan)
        else:
            self._apply(plan)

    def same_plan(self, a, b):
        """Whether plans `a` and `b` run alike: their choices and schedule
        (budget_units.plan_key), whatever their figures."""
        return plan_key(a, self._index) == plan_key(b, self._index)

    def _apply(self, plan):
        """Puts `plan` in force, with its engine loop: the one it ran with
        before where it may serve again (a rung's after the warm-up: batches
        of several lengths take turns), else a new one."""
        self._interim.end()  # (a forward of a plan for one batch may be in flight)
        if self.plan is not None and self.same_plan(plan, self.plan):
            self.plan = plan  # its figures
            return
        key = plan_key(plan, self._index)
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loop_for(plan)  # (made first: where it fails, nothing changed)
            serving = self._serving()
            for gone in [k for k in self._loops if k not in serving]:
                self._retire(self._loops.pop(gone))
            self._loops[key] = loop
        else:
            _common.end_stale_pass(loop)  # (as the context's enter does for the loop in force)
        self.plan = plan
        if all(self.owner.offloader is not kept for kept in self._loops.values()):
            self._retire(self.owner.offloader)
        self.owner.offloader = loop

    def _serving(self):
        """The plan_keys of the plans that may serve again: the race's own
        and the rungs' (budget_lengths.LongerBatches.rungs)."""
        plans = [self._race.plan] if self._race is not None else []
        return {plan_key(p, self._index) for p in plans + self.lengths.rungs()}

    def _retire(self, loop):
        """`loop` no longer runs; retired loops whose graphs are all gone
        (every forward's backward done or abandoned) are dropped."""
        self._retired = [old for old in self._retired
                         if old.live_iterations() > 0 and old is not loop]
        self._retired.append(loop)

    def _loop_for(self, plan):
        """A new engine loop for `plan`: the one a longer batch in the race
        ran it with, where there is one (its host buffers are made)."""
        loop = self._interim.take_loop(plan)
        return loop if loop is not None else self.make_loop(schedule_for(plan, self._index))

    def unit_choices(self, plan):
        """The plan's choice for each unit (glue and the head left out)."""
        return [plan["choice"][place] for place in self._index]

    # --- recompute (recompute.UnitForwards) ------------------------------------
    def install(self):
        """At the context's enter: the units this forward recomputes run
        under checkpoint (recompute.UnitForwards.install), other budgets'
        wrappers on the same units taken off first (only the budget in use
        decides how its units run)."""
        self._forwards.take_others_off()
        if self.plan is None and self._record is not None:
            room = getattr(self.probe, "room", lambda: None)() if self.allow_recompute else None
            kind = self._profiling()
            ran, choices = budget_windows.choices(
                kind, self._eligible(kind), [self._recomputable(i) for i in range(len(self.units))],
                self._windows.measured("keep" if kind == "all" else "selective"),
                self._windows.early)
            self._windows.begin(self._record, ran, choices, room)
        else:
            choices = self.unit_choices(self.plan)
        self._forwards.install(choices)

    def uninstall(self):
        """At the context's exit (recompute.UnitForwards.uninstall)."""
        self._forwards.uninstall()

    def checkpoints(self, index):
        """How unit `index` runs in the context's forward now, as the plan
        says: "recompute", "selective", "selective-offload" (under
        checkpoint) or None."""
        return self._forwards.checkpoints(index)

    def loop(self, index):
        """The engine's loop, where it takes unit `index`'s saved tensors
        now (a selective-offload unit's saved outputs then go through it),
        else None: in a backward (an outer checkpoint's re-run), or where
        an outer checkpoint's hooks won over the unit's (Hugging Face's
        gradient checkpointing: the unit then stays on device, as an
        offloaded one does, _common.UnitHooks)."""
        if _common.in_backward() or not self.owner.takes_saved_tensors(index):
            return None
        return self.owner.offloader

    def predicted_step(self, plan):
        """The model's step for the plan's choice, in ns (budget_report)."""
        return budget_report.predicted_step(self, plan)

    def limit(self):
        """The plan's limit in ns, or None (budget_report.limit)."""
        return budget_report.limit(self)

    def describe(self):
        """The plan as a table, with the profile's figures and the budget."""
        return budget_report.describe(self)
