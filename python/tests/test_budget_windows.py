"""The budget's profile on a device that cannot hold a plain step
(budget_windows.py, budget_profile.stitch): window iterations keep some
units and recompute the others, and one record is stitched from them.
On the CPU and the simulated GPU with a scripted probe whose device raises
torch.cuda.OutOfMemoryError past a capacity (budget_testing.ScriptedProbe)."""

import warnings

import pytest
import torch

from actoffload import budget, budget_profile, recompute
from actoffload.probe import Clock
from budget_testing import KEPT_RECORD, UNIT, Decoder, make, seeded_step
from models import assert_identical

KEPT = KEPT_RECORD  # one plain step of three units, by hand

# The same step in two windows, on a device that holds neither whole.
# Window A keeps units 0 and 1 and recomputes unit 2 (it leaves its output,
# 5; its backward stretch re-runs it: 300 ns). Its allocations sit 1000
# bytes up (base 1000), as another iteration's may.
WINDOW_A = {"base": 1000, "before": [1010, 1110, 1190], "after": [1110, 1210, 1195],
            "input": [5, 5, 5], "fwd": [0, 100, 200], "fwd_end": [90, 190, 300],
            "bwd": [1000, 800, 500], "end": 1200, "forward_peak": [130, 230, 260],
            "backward_peak": [150, 240, 335], "head_peak": 235,
            "bwd_allocated": [150, 200, 195], "peak": 335}
# Window B recomputes units 0 and 1 (each leaves its output, and the
# checkpoint holds unit 1's input: nothing is freed before unit 2) and
# keeps unit 2.
WINDOW_B = {"base": 0, "before": [10, 15, 20], "after": [15, 20, 120],
            "input": [5, 5, 5], "fwd": [0, 100, 200], "fwd_end": [95, 195, 290],
            "bwd": [1000, 600, 400], "end": 1300, "forward_peak": [70, 80, 140],
            "backward_peak": [130, 150, 160], "head_peak": 160,
            "bwd_allocated": [20, 25, 120], "peak": 160}
RAN_A = ["keep", "keep", "recompute"]
RAN_B = ["recompute", "recompute", "keep"]


def _units(record):
    profiled, index = budget_profile.make_profile(record, None, Clock(False), [False] * 3)
    return profiled, [profiled["units"][p] for p in index]


def test_windows_stitch_into_the_profile_of_one_plain_step():
    clock = Clock(False)
    stitched = budget_profile.stitch([WINDOW_A, WINDOW_B], [RAN_A, RAN_B], "keep", clock)
    want, want_units = _units(KEPT)
    got, got_units = _units(stitched)
    assert got_units == want_units
    assert got["units"] == want["units"]  # glue and the head too
    assert (got["outside"], got["head"]) == (want["outside"], want["head"])
    assert stitched["peak"] == KEPT["peak"]
    # The windows in the other order: the same.
    again = budget_profile.stitch([WINDOW_B, WINDOW_A], [RAN_B, RAN_A], "keep", clock)
    assert _units(again)[1] == want_units
    # One record is its own.
    assert _units(budget_profile.stitch([KEPT], [["keep"] * 3], "keep", clock))[1] == want_units


def _loop(model, x, ctx, steps, reference):
    """`steps` seeded steps, skipped where the device runs out of memory;
    every one that ran is bit-identical to `reference`. Returns the
    warnings and how many were skipped."""
    skipped = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            try:
                assert_identical(reference, seeded_step(model, x, ctx))
            except torch.cuda.OutOfMemoryError:
                skipped += 1
    return [str(w.message) for w in caught], skipped


def _profiled(capacity, outside=UNIT, steps=None, caller_holds=0, **kwargs):
    """A 4-layer model's budget (0.6 of the plain peak) on a device of
    `capacity` bytes (None: unbounded), each recomputed unit leaving an
    eighth of a kept one's bytes (and returning `caller_holds` more that
    its caller lets go after the next unit): the context, its probe, the
    number of profile iterations, the warnings and the steps skipped."""
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.6, outside=outside, **kwargs)
    probe.recompute_bytes = UNIT // 8
    probe.capacity = capacity
    probe.caller_holds = caller_holds
    joint = ctx.joint_budget
    caught, skipped, iterations = [], 0, 0
    while joint.plan is None:
        more, lost = _loop(model, x, ctx, 1, reference)
        caught += more
        skipped += lost
        iterations += 1
        assert iterations <= 12
    more, lost = _loop(model, x, ctx, steps or budget.WARMUP_ITERATIONS, reference)
    assert joint._settled
    return ctx, probe, iterations, caught + more, skipped + lost


def test_a_device_that_cannot_hold_a_plain_step_is_profiled_in_windows():
    # Plain, the step holds 4 units and, in its backward, 1 more: 5 of a
    # device of 4.5. Checkpointing fits. Windows of what fits half the
    # room (2.25 units: a unit's forward adds 1): units 0 and 1, then 1
    # and 2, then 2 and 3 (each window begins one unit early; those before
    # it recomputed, an eighth of a unit each).
    plain = _profiled(None)
    ctx, probe, iterations, caught, skipped = _profiled(int(4.5 * UNIT))
    assert skipped == 0 and not caught, caught  # the loop needs catch nothing
    joint = ctx.joint_budget
    # Two more kept iterations, and two more selective ones where the torch
    # version has selective checkpoint (the scripted device holds as much).
    assert iterations == plain[2] + 2 * (1 + recompute.selective_available())
    # Each window peaked at 3.25 units, within 0.8 of the room: the share stays.
    assert joint._windows.share == budget.budget_windows.SHARE
    # The windows' figures are one plain step's, and so is the budget.
    want = plain[0].joint_budget
    for got_unit, want_unit in zip(joint.profile["units"], want.profile["units"]):
        assert {k: v for k, v in got_unit.items() if not k.endswith("_ns")} == \
            {k: v for k, v in want_unit.items() if not k.endswith("_ns")}
    assert joint.budget_bytes == want.budget_bytes
    assert probe.peak() <= joint.budget_bytes < probe.capacity


@pytest.mark.parametrize("granularity", ["layer", "block"])
def test_a_window_measures_its_first_unit_after_one_run_as_in_a_plain_step(granularity):
    # A unit recomputed in full returns a quarter of a unit's bytes that its caller
    # lets go only after the next unit's forward: Hugging Face's eager
    # attention returns its weights, and the layer drops them at its end,
    # after its MLP (GPU runs 125-127: a window's first block, an MLP after
    # a recomputed attention, measured 24 MiB of its 49 as freed after it,
    # and was planned at half its bytes). So each window begins one unit
    # early, that unit run as a plain step runs it, and the stitch takes a
    # unit's figures from a window where the unit before it was not
    # recomputed: the figures are a plain step's.
    capacity = int(4.5 * UNIT) if granularity == "layer" else int(6.5 * UNIT)
    plain = _profiled(None, granularity=granularity, caller_holds=UNIT // 4)[0].joint_budget
    ctx, probe, iterations, caught, skipped = _profiled(
        capacity, granularity=granularity, caller_holds=UNIT // 4)
    assert skipped == 0 and not caught, caught
    joint = ctx.joint_budget
    windows = joint._profiles[0]["windows"]
    assert len(windows) > 1
    for earlier, later in zip(windows, windows[1:]):  # each window begins one unit early
        first = later.index("keep")
        assert first > 0 and earlier[first] == "keep" and earlier[first + 1] == "recompute"
    for got_unit, want_unit in zip(joint.profile["units"], plain.profile["units"]):
        assert {k: v for k, v in got_unit.items() if not k.endswith("_ns")} == \
            {k: v for k, v in want_unit.items() if not k.endswith("_ns")}
    assert joint.budget_bytes == plain.budget_bytes


def test_a_device_with_room_for_a_plain_step_is_profiled_as_before():
    # Room for a plain step and more: one kept iteration, every unit in it.
    ctx, _, iterations, caught, _ = _profiled(100 * UNIT)
    assert not caught
    assert iterations == _profiled(None)[2]
    assert ctx.joint_budget._profiles[0]["ran"] == ["keep"] * 4


def test_a_window_that_runs_out_of_memory_runs_again_smaller():
    # The backward holds 2.5 units beside: the first window (units 0 and 1,
    # within half of 4.2) needs 4.75 and fails; the next, half the share,
    # keeps unit 0 alone, and peaks at 3.875: above 0.8 of the room, the
    # next windows are smaller still (one new unit each, as they could not
    # be less). The next, unit 1 and the unit 0 it begins early with, fails
    # too: from then on windows begin where the last ended, and none runs
    # out of memory (a window of two units could fail at every step).
    ctx, probe, _, caught, skipped = _profiled(int(4.2 * UNIT), outside=int(2.5 * UNIT))
    windows = ctx.joint_budget._windows
    assert skipped == 2
    assert sum("runs again keeping fewer" in m for m in caught) == 2, caught
    assert windows.share < budget.budget_windows.SHARE / 4 * 0.8 * 4.2 / 3.875
    assert not windows.early
    assert ctx.joint_budget._profiles[0]["windows"][1:] == [
        ["recompute", "keep", "recompute", "recompute"],
        ["recompute", "recompute", "keep", "recompute"],
        ["recompute", "recompute", "recompute", "keep"]]


def test_a_window_larger_than_the_least_that_runs_out_of_memory_still_lets_windows_begin_early():
    # A window of unit 1 run early and units 2 and 3 new ran out of memory:
    # the next holds half as much, and still begins one unit early (without
    # it, a unit after a recomputed one is measured with what that one
    # returned: GPU run 133). Only the least window, one early unit and one
    # new, turns that off: it would fail at every step.
    windows = budget.budget_windows.Windows()
    r = {"kind": "keep", "ran": ["recompute", "keep", "keep", "keep", "recompute"],
         "new": [False, False, True, True, False]}
    windows.shrink(r)
    assert windows.early and windows.share == budget.budget_windows.SHARE / 2
    r = {"kind": "keep", "ran": ["recompute", "recompute", "keep", "keep", "recompute"],
         "new": [False, False, False, True, False]}
    windows.shrink(r)
    assert not windows.early and windows.share == budget.budget_windows.SHARE / 4


@pytest.mark.parametrize("granularity", ["layer", "block"])
def test_each_window_runs_its_units_as_its_record_says(granularity):
    # Blocks: 8 units (each layer's attention and MLP), each leaving 1 unit
    # of bytes: windows of two, the rest recomputed (run 125 measured one
    # block of a window as if it had run selectively).
    ctx, probe, iterations, caught, skipped = _profiled(
        int(4.5 * UNIT) if granularity == "layer" else int(6.5 * UNIT),
        granularity=granularity)
    assert skipped == 0 and not caught, caught
    windows = ctx.joint_budget._profiles[0]["windows"]
    assert len(windows) > 1
    for ran, logged in zip(windows, probe.ran):  # the profile's first forwards
        assert [None if how == "keep" else how for how in ran] == logged
        assert set(ran) == {"keep", "recompute"}
