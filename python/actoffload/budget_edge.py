"""The budget at the device's edge (budget.py; SPEC §7.9): what follows a
measured step that ran out of device memory, in a loop that caught
torch.cuda.OutOfMemoryError and went on."""

import warnings

import torch

from . import _common


def after_out_of_memory(budget):
    """At the next forward after a measured one of `budget` (a
    JointBudget) that ran out of device memory:
    - a kept profile iteration runs again: where it ran windows
      (budget_windows.py), holding less; else as it was, warned (the
      plan needs one);
    - a selective or recompute one is left out (the plan goes on without
      its figures);
    - the race's plan never runs again, and where the device gave out
      within the budget, the budget comes down to what it held
      (JointRace::OutOfMemory). Without this, the race ran the same plan
      again at each forward until its warm-up ended. From then on, a
      budget no measured plan keeps is a warning, not a refusal: the
      device lowered it, and the caller's loop goes on."""
    r, budget._record = budget._record, None
    peak = None if r is None else budget._recorder.out_of_memory(r)
    if peak is None:
        return
    if r["profile"]:
        _profile_out_of_memory(budget, r, peak)
        return
    same_length = r["input"][0] == budget._profiles[0]["input"][0]
    if budget._race is None or r.get("for_one") or not same_length:
        return  # a plan for one longer batch, or the race's on another length
    budget.gave_way = True  # a refusal from now on is the device's: a warning
    warning = budget._race.out_of_memory(peak)
    if warning is not None:
        warnings.warn(warning, stacklevel=4)
    budget._take_refusal()
    budget._apply(budget._race.plan)


def _profile_out_of_memory(budget, r, peak):
    kind = budget._profiling()
    if kind == "all" and r.get("room") is not None:
        budget._windows.shrink(r)
        warnings.warn(
            f"actoffload: the budget's profile iteration (units kept, those after "
            f"them recomputed) ran out of device memory at {peak} bytes above the "
            "forward's start; it runs again keeping fewer", stacklevel=5)
        return
    if kind == "all":
        warnings.warn(
            f"actoffload: the budget's profile iteration (nothing offloaded or "
            f"recomputed) ran out of device memory at {peak} bytes above the "
            "forward's start; the plan is made from one such step, and it runs "
            "again (a shorter batch for the first steps would fit: longer ones "
            "are planned for after it)", stacklevel=5)
        return
    budget._left_out.add(kind)
    warnings.warn(f"actoffload: the budget's {kind} profile iteration ran out of "
                  f"device memory at {peak} bytes above the forward's start; the "
                  f"plan is made without it", stacklevel=5)
    if len(budget._profiles) == len(budget._profile_kinds()):
        budget._make_profile(*budget._profiles)
        budget._start_race()


class SteadyWatch:
    """After the warm-up, whether a step ran out of device memory: the
    steady plan's forwards record nothing, so the pass's end is marked by
    the backward's end callback, queued as the first unit's output's
    gradient comes (one tensor hook a step), and the allocator's count of
    out-of-memory errors (MemoryProbe.ooms) is read at each such forward.
    A step failed where its pass did not end (a batch skipped after an
    error, but also an evaluation with grad on) and the count grew since
    its forward began: an error counted in a step whose pass ended (in the
    optimizer's step) is not blamed on a later one."""

    def __init__(self, probe, ended=None):
        self._ooms = getattr(probe, "ooms", None)
        self._on_end = ended   # called with the plan of each watched step whose pass ended
        self._count = None     # the count at the last forward read
        self._ran = None       # the plan the last watched forward ran
        self._ended = False
        self.held = None       # the plan of the last watched step whose pass ended

    def forward_begins(self):
        """At a forward after the warm-up: the plan the last watched
        forward ran where that forward did not end its backward and the
        count grew since it began; else None."""
        if self._ooms is None:
            return None
        count = self._ooms()
        failed = (self._ran if self._count is not None and not self._ended
                  and count > self._count else None)
        self._count = count
        self._ran, self._ended = None, False
        return failed

    def forget(self):
        """A measured forward begins (the race's, after a plan gave way):
        an error in it is the race's to read (after_out_of_memory), so the
        count is read anew at the next steady forward."""
        self._count = None
        self._ran, self._ended = None, False

    def first_unit_ends(self, output, plan):
        """The first unit's forward, of `plan`, ended with `output`: once
        its gradient comes, the backward's end callback marks the pass's
        end (an error in the first unit's own backward, a reload of its
        saved tensors, say, comes after that gradient, and no callback runs
        then)."""
        tensor = None if self._ran is not None else _common.first_grad_tensor(output)
        if tensor is not None:
            self._ran = plan
            tensor.register_hook(self._pass_ended)

    def forward_raised(self, plan):
        """The forward, of `plan`, raised (an out-of-memory error in it,
        perhaps)."""
        self._ran, self._ended = plan, False

    def _pass_ended(self, grad):
        torch.autograd.Variable._execution_engine.queue_callback(self._ends)

    def _ends(self):
        self._ended = True
        self.held = self._ran
        if self._on_end is not None:
            self._on_end(self._ran)


def steady_out_of_memory(budget, failed):
    """A step of `budget`'s settled plan `failed` ran out of device memory
    (the device holds less than when the race measured it: memory beside
    the model grew). Where it was made for longer batches
    (budget_lengths), one predicted lower serves them. Else the plan is
    dropped (JointRace::OutOfMemory, with the peak the race measured for
    it, at most the budget: the device holds less than that now, and below
    what the model predicts for it) and the fastest trial left that fits
    the lowered budget is kept, or the race measures plans made for it.
    From now on, a budget nothing measured keeps is a warning, not a
    refusal: the caller's loop goes on. (Where a plan with other choices
    or another schedule came since, it has not run: nothing changes; nor
    where the batch was longer than the failed plan was made for: its
    size was known too late, and the plan for it serves from now on.)"""
    if budget.plan is None or not budget.same_plan(budget.plan, failed):
        return
    if budget.lengths.ran_longer(failed):
        return  # a batch longer than the plan it ran: the plan for it serves from now on
    budget.gave_way = True
    if failed.get("for_ratio") is not None:
        budget.lengths.out_of_memory(failed, budget._steady)
        return
    race = budget._race
    choice = failed["choice"]
    peaks = [peak for _, peak, plan in race.all_trials if plan["choice"] == choice]
    peak = min(max(peaks) if peaks else budget.budget_bytes, budget.budget_bytes)
    warning = race.out_of_memory(peak)
    if warning is not None:
        warnings.warn(warning, stacklevel=4)
    race.warm_up_ended(budget._race_iteration)
    budget._take_refusal()  # a warning now
    budget._apply(race.plan)
