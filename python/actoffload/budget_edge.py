"""The budget at the device's edge (budget.py; SPEC §7.9): what follows a
measured step that ran out of device memory, in a loop that caught
torch.cuda.OutOfMemoryError and went on."""

import warnings


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
      again at each forward until its warm-up ended."""
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
    warning = budget._race.out_of_memory(peak)
    if warning is not None:
        warnings.warn(warning, stacklevel=4)
    budget._take_refusal()
    budget._apply(budget._race.plan)


def _profile_out_of_memory(budget, r, peak):
    kind = budget._profiling()
    if kind == "all" and r.get("room") is not None:
        budget._windows.shrink()
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
