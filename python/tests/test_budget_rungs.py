"""The memory budget (budget.py) after its warm-up on batches of varying
length (budget_lengths.LongerBatches, SPEC §7.8): a batch longer than any
before, or shorter than the profiled one, has a plan made for its length
(a rung); each batch runs the plan of the shortest rung at or above it; a
few rungs and their loops are kept; gradient accumulation over several
lengths loses nothing. On the CPU and the simulated GPU with a scripted
probe (lengths_testing.py)."""

import warnings

import pytest
import torch.nn.modules.module as module_hooks

from actoffload import _common
from actoffload.budget_units import schedule_for

from budget_testing import Decoder, seeded_step
from lengths_testing import (FixedFirst, LayersFirst, Quadratic, accumulated, by_keyword,
                             compiled_decoder, compiled_embedding, offloading, peaks_as_planned,
                             raising_once, scripted, tokens, warmed_up)
from models import assert_identical


@pytest.mark.parametrize("first_call", ["positional", "a unit", "of one size", "compiled",
                                        "compiled embedding"])
def test_after_the_warm_up_a_longer_batch_is_planned_for(first_call):
    # The warm-up on 32 tokens settles a plan that recomputes (a lean
    # steady state). A batch of 48: where the forward's first positional
    # call is the model's (as a Hugging Face model's embedding gets
    # input_ids), the forward runs a plan made for 48, within the budget;
    # where it is the first unit's, or takes a tensor of one size whatever
    # the batch (then the first unit's input tells), or the layers or
    # another module of the model are compiled (no global hook is put up:
    # it would change what dynamo traces), the batch runs the plan for 32 (over the budget at 48) and
    # the next forward the one for 48. From then on
    # every batch, 48 and shorter, is within the budget; one of 40 changes
    # nothing; one of 160, where no plan fits, is warned about once,
    # naming the least budget, and planned for that. Every step
    # bit-identical to the same step without the budget.
    at_once = first_call == "positional"  # the plan for 48 in its own forward
    model = {"positional": Decoder, "a unit": LayersFirst, "of one size": FixedFirst,
             "compiled": compiled_decoder, "compiled embedding": compiled_embedding,
             }[first_call]()
    model, ctx, probe = scripted(0.8, model, allow_offload=False)
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))
    run = by_keyword if first_call in ("a unit", "of one size") else seeded_step
    hooked = []
    model.head.register_forward_pre_hook(
        lambda module, args: hooked.append(len(module_hooks._global_forward_pre_hooks)))

    def step(length):
        x = tokens(length, next(seed))
        assert_identical(run(model, x), run(model, x, ctx))
        return probe.peak()

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        while joint.measuring:
            step(32)
        profiled = joint.plan
        assert step(32) <= joint.budget_bytes
        assert (step(48) <= joint.budget_bytes) == at_once
        assert not any(hooked)  # the first call took it off, if it was put up
        for length in (48, 32, 48, 40):
            assert step(length) <= joint.budget_bytes, length
        longer = joint.plan
        assert joint.unit_choices(longer).count("recompute") > \
            joint.unit_choices(profiled).count("recompute")
        assert joint.lean()  # the steady state ran without the engine
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step(160)
        for length in (160, 48, 160):
            step(length)
    said = [str(w.message) for w in seen]
    assert len(said) == 1 and "5.00 times the profiled one's size needs a budget of at " \
        "least" in said[0], said
    least = int(said[0].split("at least ")[1].split()[0])
    assert least > joint.budget_bytes
    assert probe.peak() <= least  # at 160, the least budget's plan
    assert joint.plan is not longer


@pytest.mark.parametrize("first_call", ["positional", "a unit", "compiled"])
def test_after_the_warm_up_each_batch_runs_the_plan_for_the_shortest_length_planned_at_or_above_it(
        first_call):
    # Dynamic padding: after the warm-up on 32 tokens, batches of 48 and
    # then 64 get plans of their own (LongerBatches' rungs). Where the
    # forward's first call tells its size in time (positional), each batch
    # runs the plan for the shortest length planned at or above it: 32 the
    # race's own, 40 and 48 the one for 48, 56 and 64 the one for 64, each
    # recomputing fewer units than the next (before, every batch ran the
    # plan for the longest: GPU run 154, 2048-token batches at 2.07-2.44 of
    # their plain step where their own plan ran them at 1.5-2.0). Where it
    # cannot (the first unit's own call, compiled layers), every batch runs
    # the longest's plan, which fits it, from the forward after that
    # length's first. Within the budget but for such a first forward;
    # every step bit-identical to the same step without the budget.
    in_time = first_call == "positional"
    model = {"positional": Decoder, "a unit": LayersFirst, "compiled": compiled_decoder,
             }[first_call](layers=6)
    model, ctx, probe = scripted(0.8, model, allow_offload=False)
    joint = ctx.joint_budget
    run = by_keyword if first_call == "a unit" else seeded_step
    seed = iter(range(10 ** 6))
    ran = []  # the plan in force at each budget step's head
    model.head.register_forward_pre_hook(
        lambda module, args: ran.append(joint.plan) if ctx._active else None)

    def step(length, within=True):
        x = tokens(length, next(seed))
        assert_identical(run(model, x), run(model, x, ctx))
        assert joint.plan is None or not within or probe.peak() <= joint.budget_bytes, length
        return ran[-1]

    def recomputed(plan):
        return joint.unit_choices(plan).count("recompute")

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        while joint.measuring:
            step(32)
        for length in (48, 64):  # the rungs (a first forward not in time runs the one before)
            step(length, within=in_time)
        lengths = (32, 40, 48, 56, 64, 32, 64, 40)
        plans = [step(length) for length in lengths]
    for length, plan in zip(lengths, plans):
        made_for = 1.0 if length == 32 else 1.5 if length <= 48 else 2.0
        if not in_time:
            made_for = 2.0
        assert plan.get("for_ratio", 1.0) == made_for, (length, plan)
        if made_for == 1.0:
            assert joint.same_plan(plan, joint._race.plan)
    if in_time:
        at_32, at_48, at_64 = plans[0], plans[2], plans[4]
        assert recomputed(at_32) < recomputed(at_48) < recomputed(at_64)
    assert joint.plan["for_ratio"] == (1.5 if in_time else 2.0)  # (the last step's: 40)


def test_after_the_warm_up_lengths_that_grow_step_by_step_keep_a_few_plans_and_loops(monkeypatch):
    # A sequence-length warm-up after the budget's: every batch a token
    # longer than the last, 33 to 64, then batches of several lengths
    # again. Each new length gets its plan; plans of four kinds of choices
    # come (two to five units recomputed), but at most LENGTH_RUNGS lengths
    # (two here) keep one, and an engine loop with its host buffers: the
    # loops of the others are let go. Before, each length kept its loop.
    # Every batch still runs a plan made for a length at or above its own,
    # and every step is bit-identical.
    from actoffload import budget
    monkeypatch.setattr(budget, "LENGTH_RUNGS", 2)
    model, ctx, probe = scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx)
    kinds, made = set(), joint.lengths._made

    def recorded(*args, **kwargs):
        plan = made(*args, **kwargs)
        if plan:
            kinds.add(tuple(plan["choice"]))
        return plan
    joint.lengths._made = recorded
    ran, kept = [], []
    model.head.register_forward_pre_hook(
        lambda module, args: ran.append((args[0].shape[1], joint.plan)) if ctx._active else None)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        for length in list(range(33, 65)) + [32, 40, 50, 60, 64, 36]:
            x = tokens(length, it)
            it += 1
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
            kept.append((len(joint.lengths.rungs()), len(joint._loops)))
    assert len(kinds) >= 3
    assert max(rungs for rungs, _ in kept) == 2
    assert all(loops <= 3 for _, loops in kept), kept  # (the race's plan's too)
    assert joint.lengths.rungs()[-1]["for_ratio"] == 2.0
    for length, plan in ran[-6:]:
        assert plan.get("for_ratio", 1.0) * 32 >= length, (length, plan)


def test_after_the_warm_up_a_shorter_batch_runs_a_lighter_plan_until_a_step_of_it_is_over():
    # After the warm-up on 32 tokens (the race's plan re-runs units), a
    # batch of 16, seen at its first call, runs a plan made for it: the
    # race's with fewer units re-run, none that the race's keeps (engine
    # PlanForShorter), within the budget. One of 26, longer than 16 and an
    # eighth or more from it, gets its own too, between the two (before,
    # only the shortest yet did: 26 ran the race's). One of 28, within an
    # eighth of 26 and longer, runs the race's; one of 24, within an eighth
    # of 26 and shorter, runs 26's. Then the device holds more beside the
    # model than the profile saw: a checked step of 16's plan peaks over
    # the budget, is warned about once, and batches of 16 run 26's plan,
    # the next longer, from then on. Every step bit-identical.
    model, ctx, probe = scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx)
    race = joint.unit_choices(joint._race.plan)
    assert "recompute" in race
    ran = []
    model.head.register_forward_pre_hook(
        lambda module, args: ran.append(joint.plan) if ctx._active else None)

    def step(length):
        nonlocal it
        x = tokens(length, it)
        it += 1
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        return ran[-1], probe.peak()

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        lighter, peak = step(16)
        assert lighter["for_ratio"] == 0.5 and peak <= joint.budget_bytes
        choices = joint.unit_choices(lighter)
        assert choices.count("recompute") < race.count("recompute")
        assert all(c != "recompute" for c, r in zip(choices, race) if r == "keep")
        between, peak = step(26)
        assert between["for_ratio"] == 26 / 32 and peak <= joint.budget_bytes
        count = joint.unit_choices(between).count("recompute")
        assert choices.count("recompute") < count < race.count("recompute")
        for length in (28, 32):
            plan, peak = step(length)
            assert plan.get("for_ratio", 1.0) == 1.0 and peak <= joint.budget_bytes, length
        plan, _ = step(16)
        assert plan["length_id"] == lighter["length_id"]
        plan, _ = step(24)
        assert plan["length_id"] == between["length_id"]
    probe.over = joint.budget_bytes  # beside the model from now on
    with pytest.warns(UserWarning, match="lighter plan for batches 0.50 times .* over the "
                      "budget .* the next longer length from now on"):
        step(16)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        for length in (16, 16):
            plan, _ = step(length)
            assert plan["length_id"] == between["length_id"], length


def test_after_the_warm_up_a_plan_in_force_stays_where_no_longer_batch_came():
    # The tests that put a plan in force by hand after the warm-up
    # (budget_testing.forced_plan: test_gpu_budget.py, loop_doors.py) rely
    # on this: where no batch of another length than the profiled one has come, the
    # first call's plan for the batch is the race's, the plan for every
    # batch, and nothing is put in force in its place (GPU run 157, before
    # this: a forced selective-offload plan was replaced by the race's at
    # its first forward). Steps bit-identical.
    from budget_testing import forced_plan
    model, ctx, probe = scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx)
    forced = forced_plan(joint, {0: "keep", 1: "keep", 2: "keep", 3: "recompute"})
    assert not joint.same_plan(forced, joint._race.plan)
    joint._apply(forced)
    for length in (32, 32, 32):  # (a shorter batch may get a lighter plan of its own)
        x = tokens(length, it)
        it += 1
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert joint.plan is forced, length


def test_a_longer_batch_under_a_plan_that_offloads_is_planned_for_too():
    # A plan that offloads (offloading()): the steady state keeps the engine and its unit
    # hooks; the plan for a batch of 48 is the one the race makes for it
    # (its predicted peak, at 48, within the budget), in force from that
    # batch's forward on, with the engine's loop made anew before its first
    # unit. Where the engine's hooks are in force for the whole forward
    # (torch < 2.8), the plan starts with the next forward (see the test
    # below). Per unit, batches of 32 and 48 then take turns, each on its
    # own plan and loop: the race's and the one made for 48, each kept (its
    # host buffers made), no other loop made; else every batch runs the
    # plan for 48. Steps bit-identical.
    model, ctx, probe = offloading()
    per_unit = _common.saved_hooks_top() is not NotImplemented
    joint = ctx.joint_budget
    peaks_as_planned(probe, joint)
    in_force = []  # (length, the engine's loop) of each budget step, read at its head
    model.head.register_forward_pre_hook(
        lambda module, args: in_force.append((args[0].shape[1], ctx.offloader))
        if ctx._active else None)
    made = []
    make_loop = joint.make_loop
    joint.make_loop = lambda schedule: (made.append(schedule), make_loop(schedule))[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for it in range(200):
            if not joint.measuring:
                break
            x = tokens(32, it)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert not joint.measuring and not joint.lean()
        assert "offload" in joint.plan["choice"], joint.plan["choice"]
        x = tokens(32, 999)  # the first forward after the warm-up
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        loop, before = ctx.offloader, len(made)
        pushed = _common.pushes(loop)
        for it, length in enumerate((48, 48, 32, 48)):
            x = tokens(length, 1000 + it)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
            if it == 0 and per_unit:  # the first batch of 48 went to the new loop alone
                assert ctx.offloader is not loop
                assert _common.offloaded(ctx.offloader) > 0
                assert _common.pushes(loop) == pushed
            elif it == 0:  # torch < 2.8: the next one
                assert ctx.offloader is loop and _common.pushes(loop) > pushed
    planned = joint._race.for_length(1.5)
    assert joint.plan["choice"] == planned["choice"]
    assert planned["needs_budget"] == 0
    assert planned["peak_bytes"] <= joint.budget_bytes
    # One unit more offloaded than at 32 tokens; the engine's loop made anew.
    assert planned["choice"].count("offload") > joint._race.plan["choice"].count("offload")
    assert ctx.offloader is not loop
    steady = in_force[-5:]  # 32, then 48, 48, 32, 48
    if per_unit:
        assert [l is loop for _, l in steady] == [True, False, False, True, False]
        assert steady[1][1] is steady[2][1] is steady[4][1]
    else:
        assert [l is loop for _, l in steady] == [True, True, False, False, False]
    assert len(made) == before + 1  # the loop for 48, made once


def _makes_a_loop(make_loop, schedule):
    """Whether the engine takes `schedule` for a loop."""
    try:
        make_loop(schedule)
    except RuntimeError:  # the engine's Status (OffloadError)
        return False
    return True


def test_a_plan_of_the_same_choices_on_another_schedule_runs_a_loop_of_its_own():
    # The planner may give a longer batch (or a plan giving way) the same
    # choices on another schedule: an offloaded unit reloaded later, for a
    # lower peak. Put in force, it runs an engine loop of its own, made
    # with that schedule (before, the plan's figures changed and the loop
    # in force kept its schedule: GPU run 140); a plan of the same choices
    # and schedule keeps the loop; one whose schedule the engine refuses
    # changes nothing. Steps bit-identical.
    model, ctx, probe = offloading()
    joint = ctx.joint_budget
    peaks_as_planned(probe, joint)
    it = warmed_up(model, ctx)
    plan = joint.plan
    made = []  # the schedules of the loops made from here
    make_loop = joint.make_loop
    joint.make_loop = lambda schedule: (made.append(schedule), make_loop(schedule))[1]
    offloaded = [p for p, c in enumerate(plan["choice"]) if c == "offload"]
    assert offloaded, plan["choice"]
    loop = ctx.offloader
    joint._apply(dict(plan, step_ns=plan["step_ns"] + 1))  # its figures
    assert ctx.offloader is loop
    # The first offloaded unit released or reloaded beside another unit
    # (where the engine's loop takes that schedule: a reload not after its
    # own backward began).
    unit = offloaded[0]

    def moved(key, beside):
        return dict(plan, **{key: [during if p != unit else beside
                                   for p, during in enumerate(plan[key])]})
    again = next(other for other in (
        moved(key, beside) for key in ("reloaded_during", "released_during")
        for beside in range(len(plan["choice"])))
        if schedule_for(other, joint._index) != schedule_for(plan, joint._index)
        and _makes_a_loop(make_loop, schedule_for(other, joint._index)))
    # One the engine refuses changes nothing.
    bad = next(other for other in (
        moved(key, beside) for key in ("reloaded_during", "released_during")
        for beside in range(len(plan["choice"])))
        if not _makes_a_loop(make_loop, schedule_for(other, joint._index)))
    with pytest.raises(RuntimeError, match="schedule table"):
        joint._apply(bad)
    assert joint.plan is not bad and ctx.offloader is loop
    made.clear()
    joint._apply(again)
    assert ctx.offloader is not loop and joint.plan is again
    assert made == [schedule_for(again, joint._index)] != [schedule_for(plan, joint._index)]
    x = tokens(32, it)
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))


def test_after_the_warm_up_a_checked_plan_in_gradient_accumulation_or_raising_loses_nothing():
    # After the warm-up on 32 tokens, on a device where bytes grow as the
    # square of the length: the first batches of 40 come as two forwards
    # before one backward, then as a forward that raises midway (caught by
    # the loop), then as plain steps. Every step is bit-identical to the
    # same step without the budget; the check of the plan for 40 goes on
    # through them, and the plain steps end within the budget, warned once.
    model, ctx, probe = scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = warmed_up(model, ctx)
    probe.__class__ = Quadratic
    fail = raising_once(model.layers[1])
    with pytest.warns(UserWarning) as told:
        batches = [tokens(40, it), tokens(40, it + 1)]
        assert_identical(accumulated(model, batches), accumulated(model, batches, ctx))
        fail.append(1)
        with pytest.raises(RuntimeError, match="a bad batch"):
            with ctx:
                model(tokens(40, it + 2))
        peaks = []
        for seed in range(it + 3, it + 9):
            x = tokens(40, seed)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
            peaks.append(probe.peak())
    said = [str(w.message) for w in told]
    assert len(said) == 1 and "peaked at" in said[0], said
    assert joint.plan["for_ratio"] == 1.25
    assert all(peak <= joint.budget_bytes for peak in peaks), (peaks, joint.budget_bytes)


@pytest.mark.parametrize("allow_offload", [False, True])
def test_after_the_warm_up_batches_of_several_lengths_in_one_accumulation_or_raising_lose_nothing(
        allow_offload):
    # After the warm-up on 32 tokens and a batch of 48 (a rung), batches
    # of 32, 48 and 40 come as three forwards before one backward (each on
    # its length's plan and engine loop where the forward can be set up
    # again at its first call: the race's, 48's, 48's), then a forward of 32
    # that raises midway (caught by the loop), then plain steps of each
    # length. Every step bit-identical to the same step without the budget;
    # at the end no loop holds an iteration (nothing leaked), and the plan
    # in force after a step of 48 is the one for 48.
    model, ctx, probe = (offloading() if allow_offload else
                          scripted(0.8, allow_offload=False))
    joint = ctx.joint_budget
    if allow_offload:
        peaks_as_planned(probe, joint)
    it = warmed_up(model, ctx)
    fail = raising_once(model.layers[1])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        for length in (32, 48, 48):
            x = tokens(length, it)
            it += 1
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert joint.lengths.rungs() and joint.plan["for_ratio"] == 1.5
        batches = [tokens(32, it), tokens(48, it + 1), tokens(40, it + 2)]
        assert_identical(accumulated(model, batches), accumulated(model, batches, ctx))
        fail.append(1)
        with warnings.catch_warnings():  # (an offloading plan's loop says what it dropped)
            warnings.filterwarnings("ignore", message="actoffload: AbandonIteration")
            with pytest.raises(RuntimeError, match="a bad batch"):
                with ctx:
                    model(tokens(32, it + 3))
        for seed, length in enumerate((32, 48, 40, 32, 48), start=it + 4):
            x = tokens(length, seed)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.plan["for_ratio"] == 1.5
    import gc
    gc.collect()
    loops = list(joint._loops.values()) + joint._retired + [ctx.offloader]
    assert all(loop.live_iterations() == 0 for loop in loops)
