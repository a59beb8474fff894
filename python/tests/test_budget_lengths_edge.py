"""The memory budget (budget.py) after its warm-up, where a plan made for
a longer batch's length does not hold: a step over the budget or out of
memory gives way to a plan for that length predicted lower, or to the last
that held, and the smallest names the budget it needs (budget_edge.py,
LongerBatches::StepChecked and OutOfMemory). On the CPU and the simulated
GPU with a scripted probe (lengths_testing.py)."""

import warnings

import pytest
import torch

from budget_testing import Decoder, seeded_step, skipping
from lengths_testing import (HoldsOnlyOne, LayersFirst, Quadratic, by_keyword, scripted,
                             settled_then_longer, tokens, warmed_up)
from models import assert_identical


def test_after_the_warm_up_a_plan_for_longer_batches_out_of_memory_gives_way():
    # After the warm-up on 32 tokens, batches of 40 run a plan made for
    # them; then the device holds less than that plan needs (memory beside
    # the model grew). A loop that skips the batch goes on with a plan for
    # 40 predicted lower (LongerBatches.out_of_memory, the engine's
    # PlanForLengthBelow), bit-identical; a batch of 32 runs the race's own
    # plan, and the next of 40 the lower one again. Before, only the race's
    # own plan gave way, and every step of 40 failed.
    model, ctx, probe, x, reference = settled_then_longer(40)
    joint = ctx.joint_budget
    longer = joint.plan
    assert longer["for_ratio"] == 1.25
    probe.capacity = probe.peak() - 1
    probe.out_of_memory = "backward"
    results, ran, caught = skipping(model, x, ctx, 6)
    assert results[0] is None and ran[0] is longer
    assert all(r is not None for r in results[1:]), results
    for r in results[1:]:
        assert_identical(reference, r)
    assert ran[1]["peak_bytes"] < longer["peak_bytes"] and ran[1]["for_ratio"] == 1.25
    assert all(plan is ran[1] for plan in ran[1:])
    assert len(caught) == 1 and "1.25 times the profiled one's size ran out of device " \
        "memory after the warm-up: the device cannot hold that plan" in caught[0], caught
    assert probe.peak() <= probe.capacity
    shorter = tokens(32, 999)
    assert_identical(seeded_step(model, shorter), seeded_step(model, shorter, ctx))
    assert joint.plan.get("length_id", 0) == 0
    assert joint.same_plan(joint.plan, joint._race.plan)
    assert_identical(reference, seeded_step(model, x, ctx))
    assert joint.plan["length_id"] == ran[1]["length_id"]


def test_after_the_warm_up_a_plan_for_longer_batches_measured_over_the_budget_gives_way():
    # After the warm-up on 32 tokens, batches of 40 run a plan made for
    # them, which nothing measured; on this device bytes grow as the square
    # of the length, where the model takes them to grow as the length (GPU
    # runs 134-135: x1.18 of the budget, unwarned). Its first steps of that
    # length read their peak, as the race checks the plan it keeps: the
    # first is over; the engine fits the growth (PlanForLengthMeasured: the
    # bytes grow as the length to the power 2) and the plan it makes with
    # it runs from the next step, warned about once, checked in turn,
    # within the budget. A step of 32 between them runs the race's own
    # plan, is not counted, and leaves the allocator's peak counter alone
    # (nor does it end the checks); after CHECKED_ITERATIONS
    # steps of 40 it is no longer reset. Batches of 48 then get a plan made
    # with that growth, within the budget from their first step. Every step
    # bit-identical.
    model, ctx, probe = scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx)
    probe.__class__ = Quadratic
    peaks, plans, resets = [], [], []

    def at_head(module, args):  # in the budget's steps: the peak and the plan in force
        if ctx._active:
            peaks.append(probe.peak())
            plans.append(joint.plan)
    model.head.register_forward_pre_hook(at_head)
    reset_peak = probe.reset_peak
    probe.reset_peak = lambda: (resets.append(len(peaks)), reset_peak())
    with pytest.warns(UserWarning) as told:
        for length in (40, 40, 32, 40, 40, 40, 40, 40, 48, 48):
            x = tokens(length, it)
            it += 1
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    said = [str(w.message) for w in told]
    assert len(said) == 1 and "1.25 times the profiled one's size peaked at" in said[0] \
        and "to the power 2.0" in said[0], said
    assert joint._race.length_exponent == pytest.approx(2, abs=0.01)
    first, lower = plans[0], plans[1]
    assert first["for_ratio"] == lower["for_ratio"] == 1.25
    assert peaks[0] > joint.budget_bytes
    assert lower["peak_bytes"] <= joint.budget_bytes < peaks[0]
    assert all(plans[i]["length_id"] == lower["length_id"] for i in (1, 3, 4, 5, 6, 7))
    assert plans[2].get("length_id", 0) == 0  # the step of 32: the race's own plan
    assert plans[8]["for_ratio"] == 1.5
    assert all(peak <= joint.budget_bytes for peak in peaks[1:]), peaks
    # Reset as the first unit of each checked step of 40 began: the first
    # plan's, then the lower plan's four (not the step of 32: its counter is
    # left alone, and it is not counted), ending at step 5. Then 48's two.
    assert resets == [0, 1, 3, 4, 5, 8, 9], resets


def test_after_the_warm_up_the_smallest_plan_for_longer_batches_measured_over_names_the_budget_it_needs():
    # Batches of 160 tokens need more than the budget: their plan is the
    # smallest, warned about with the least budget. On a device where bytes
    # grow as the square of the length, its first step measures over even
    # that: a warning names the least budget at the growth measured, once;
    # the plan runs on (none is smaller), within that, and its checks end.
    model, ctx, probe = scripted(0.8, allow_offload=False)
    it = warmed_up(model, ctx)
    probe.__class__ = Quadratic
    resets = []
    reset_peak = probe.reset_peak
    probe.reset_peak = lambda: (resets.append(it), reset_peak())
    with pytest.warns(UserWarning) as told:
        for _ in range(4):
            x = tokens(160, it)
            it += 1
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    said = [str(w.message) for w in told]
    assert len(said) == 2 and "needs a budget of at least" in said[0], said
    assert "no plan for them is predicted to hold less; no plan holds the budget at that " \
        "growth, and the least budget that does is" in said[1], said
    named = int(said[0].split("at least ")[1].split()[0])
    least = int(said[1].split("the least budget that does is ")[1].split()[0])
    assert named < least and probe.peak() <= least * 1.02, (named, least, probe.peak())
    assert len(resets) == 1  # its first step alone was checked


def test_after_the_warm_up_a_plan_for_longer_batches_that_held_comes_back_where_lower_ones_fail():
    # Six layers; after the warm-up on 32 tokens, batches of 40 run a plan
    # made for them. The device comes to hold less: it gives way to one
    # predicted lower (three layers recomputed, then four), which runs. A
    # step of it then fails (the allocator's blocks, say), and every plan
    # predicted lower still peaks far above its prediction: each fails
    # once, and then the plan whose steps ran comes back, bit-identical,
    # rather than the smallest failing at every step (GPU run 135: a plan
    # for 1.25 times the profiled size ran three steps, failed once, and
    # the smallest after it failed seven times in a row).
    model, ctx, probe, x, reference = settled_then_longer(40, model=Decoder(layers=6))
    probe.__class__ = HoldsOnlyOne
    joint = ctx.joint_budget
    probe.capacity = probe.peak() - 1
    results, ran, _ = skipping(model, x, ctx, 3)
    assert results[0] is None and None not in results[1:]
    held = joint.plan
    assert ran[1] is held and held["for_ratio"] == 1.25
    probe.only, probe.extra = tuple(held["choice"]), probe.capacity
    probe.over = probe.capacity  # one step of it fails
    assert skipping(model, x, ctx, 1)[:2] == ([None], [held])
    probe.over = 0
    results, ran, caught = skipping(model, x, ctx, 8)
    skipped = [i for i, r in enumerate(results) if r is None]
    assert 1 <= len(skipped) <= 3 and skipped == list(range(len(skipped))), results
    lower = [plan["peak_bytes"] for plan in ran[:len(skipped)]]
    assert all(peak < held["peak_bytes"] for peak in lower) and lower == sorted(lower)[::-1]
    assert all(plan["choice"] == held["choice"] for plan in ran[len(skipped):])
    for r in results[len(skipped):]:
        assert_identical(reference, r)
    assert "the last plan a whole step of theirs ran with runs again" in caught[-1], caught
    # Another step of it fails: the plans below it failed at this length
    # already, and it runs on.
    probe.over = probe.capacity
    assert skipping(model, x, ctx, 1)[:2] == ([None], [joint.plan])
    probe.over = 0
    results, ran, caught = skipping(model, x, ctx, 3)
    assert None not in results and all(plan["choice"] == held["choice"] for plan in ran)
    assert len(caught) == 1 and "ran out of memory before; it runs on" in caught[0], caught


def test_after_the_warm_up_a_plan_for_longer_batches_that_held_before_the_device_shrank_does_not_come_back():
    # Batches of 40 ran a plan made for them; then the device holds less
    # than it, and every plan predicted lower peaks far above its
    # prediction. The plan whose steps ran before the first error is not
    # brought back (the device held more then: GPU run 136, where it failed
    # at each of twelve steps): the last plan tried runs on, warned about.
    model, ctx, probe, x, _ = settled_then_longer(40, model=Decoder(layers=6))
    probe.__class__ = HoldsOnlyOne
    joint = ctx.joint_budget
    held = joint.plan
    probe.capacity = probe.peak() - 1
    probe.only, probe.extra = ("none",), probe.capacity
    results, ran, caught = skipping(model, x, ctx, 8)
    assert results == [None] * 8
    assert all(plan["choice"] != held["choice"] for plan in ran[1:]), ran
    assert "it runs on" in caught[-1], caught


def test_after_the_warm_up_the_smallest_plan_for_longer_batches_out_of_memory_is_warned_about():
    # Batches of 160 tokens need more than the budget: their plan is the
    # smallest (warned about). Where the device holds less than even that,
    # no plan is predicted lower: a warning says so and it runs on (the
    # loop skips such batches; shorter ones would fit).
    with pytest.warns(UserWarning, match="needs a budget of at least"):
        model, ctx, probe, x, _ = settled_then_longer(160)
    smallest = ctx.joint_budget.plan
    probe.capacity = probe.peak() - 1
    probe.out_of_memory = "forward"
    results, ran, caught = skipping(model, x, ctx, 3)
    assert results == [None] * 3 and all(plan is smallest for plan in ran)
    assert caught and all("no plan for them is predicted to hold less" in m for m in caught), \
        caught


def test_after_the_warm_up_a_step_that_failed_before_its_batchs_plan_came_blames_no_plan():
    # The model's first positional call is its first unit's, so a longer
    # batch is seen there: its step runs the plan for 32 at 48 tokens, over
    # the budget, and the plan for 48 comes at the next forward. On a
    # device that holds the budget and no more, that step runs out of
    # memory. The plan that failed is not the one in force now, which has
    # not run yet: it stays (SteadyWatch says which plan a failed step ran).
    model, ctx, probe = scripted(0.8, LayersFirst(), allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx, by_keyword)
    x = tokens(48, it)
    reference = by_keyword(model, x)
    planned = joint._race.for_length(1.5)["choice"]
    assert planned != joint.plan["choice"]
    probe.capacity = joint.budget_bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(torch.cuda.OutOfMemoryError):
            by_keyword(model, x, ctx)
        for _ in range(3):
            assert_identical(reference, by_keyword(model, x, ctx))
    assert not caught, [str(w.message) for w in caught]
    assert joint.plan["choice"] == planned and joint.plan["for_ratio"] == 1.5
