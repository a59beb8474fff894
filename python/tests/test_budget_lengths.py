"""The memory budget (budget.py) on batches of varying length, as dynamic
padding feeds them, on the CPU and the simulated GPU with a scripted probe:
the profile and the race measure batches of one length (SHAPE_PATIENCE);
after the warm-up, a batch longer than any before has a plan made for its
length (budget_lengths.LongerBatches)."""

import threading
import warnings

import pytest
import torch
import torch.nn.modules.module as module_hooks

import actoffload
from actoffload import _common
from actoffload.budget_units import schedule_for
from budget_testing import (UNIT, Decoder, ScriptedProbe, compile_layers, compile_module, make,
                            seeded_step, skipping)
from models import assert_identical, train_step


class _ScalesWithLength(ScriptedProbe):
    """A scripted device whose every byte grows with the batch's sequence
    length: its figures are those of a batch of `reference` tokens."""

    reference = 32

    def __init__(self, *args, **kwargs):
        self.length = self.reference
        super().__init__(*args, **kwargs)

    def watch(self, units):
        super().watch(units)
        units[0].register_forward_pre_hook(_common.eagerly(
            lambda module, args: setattr(self, "length", args[0].shape[1])))

    def _scaled(self, name):
        return self.__dict__["_" + name] * self.length // self.reference

    unit_bytes = property(lambda self: self._scaled("unit_bytes"),
                          lambda self, v: self.__dict__.__setitem__("_unit_bytes", v))
    selective_bytes = property(lambda self: self._scaled("selective_bytes"),
                               lambda self, v: self.__dict__.__setitem__("_selective_bytes", v))
    outside = property(lambda self: self._scaled("outside"),
                       lambda self, v: self.__dict__.__setitem__("_outside", v))

    def peak(self):
        # Once planned: the plan's choice as the profiled units predict it
        # (the plan in force may be one made for a longer batch), scaled to
        # this batch. Plans that offload are not scripted (their peak
        # depends on the budget they were made for).
        joint = self.ctx.joint_budget
        if joint.plan is not None:
            assert "offload" not in joint.plan["choice"]
            d2h, h2d = joint.bandwidths
            at_reference = _common.ext().evaluate_joint(
                joint.model_units, d2h, h2d, 1 << 40, list(joint.plan["choice"]), True)
            return at_reference["peak_bytes"] * self.length // self.reference + self.over
        return super().peak()


def test_batches_of_varying_length_through_the_profile_and_the_race():
    # Dynamic padding: every batch has another sequence length, from the
    # profile iterations on, on a device whose bytes grow with the length.
    # Each step is bit-identical to the same step without the budget; the
    # profile and the race measure only batches of the first one's length,
    # so they end as at one length: the budget neither refused nor raised,
    # a plan within it. (Measuring every batch, a 64-token batch's peak was
    # taken for the plan's, twice what it is at 32: every plan measured
    # over, and the budget was refused, naming the lowest peak measured;
    # so was a Llama h2048 on an H200, run 88.) Which plan the race keeps
    # depends on its measured steps, here the CPU's: not compared. Its
    # batches of 64 need more than the budget (0.6 of the 32-token peak):
    # said once, naming the least budget that holds them.
    model = Decoder()
    probe = _ScalesWithLength(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6, probe=probe,
                                        backend="sim", min_offload_size=1024,
                                        allow_offload=False)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    joint = ctx.joint_budget
    lengths = (32, 64, 16, 40)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for it in range(120):
            if not joint.measuring:
                break  # (a longer batch after it: the tests below)
            x = torch.randn(2, lengths[it % len(lengths)], 64,
                            generator=torch.Generator().manual_seed(it))
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    said = [str(w.message) for w in seen]
    assert len(said) == 1 and "a batch 2.00 times the profiled one's size needs a budget of " \
        "at least" in said[0], said
    assert not joint.measuring
    assert joint.budget_bytes == int(0.6 * joint.profile["peak"])
    assert joint.plan["peak_bytes"] <= joint.budget_bytes
    assert set(joint.unit_choices(joint.plan)) != {"keep"}


def test_batches_of_a_new_length_every_step_still_end_the_warm_up():
    # No two batches alike: the profile makes its later iterations again at
    # most SHAPE_PATIENCE times, then goes on without them (warned), and the
    # race, having waited as long as its warm-up for a like batch, measures
    # what comes. Steps bit-identical (every eighth checked); a plan at the end.
    model = Decoder()
    ctx, _ = make(model, 0.6)
    joint = ctx.joint_budget
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for it in range(110):
            x = torch.randn(2, 16 + it, 64, generator=torch.Generator().manual_seed(it))
            got = seeded_step(model, x, ctx)
            if it % 8 == 0 or not joint.measuring:
                assert_identical(seeded_step(model, x), got)
            if not joint.measuring:
                break
    said = [str(w.message) for w in seen]
    assert sum("batches of other lengths" in m for m in said) == 1, said
    assert not joint.measuring and joint.plan is not None
    assert set(joint.unit_choices(joint.plan)) != {"keep"}


class _LayersFirst(Decoder):
    """Its forward's first module call that takes a tensor positionally is
    its first layer's (it is called by keyword)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        del self.embed

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)[0]
        return self.head(x)


class _FixedFirst(Decoder):
    """Called by keyword, its forward's first module call takes a tensor of
    one size whatever the batch (a learned bias made from a buffer)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("position", torch.ones(1, 1, 64))

    def forward(self, x):
        return super().forward(x + self.embed(self.position))


def _compiled_decoder(**kwargs):
    model = Decoder(**kwargs)
    compile_layers(model)
    return model


def _compiled_embedding():
    model = Decoder()
    compile_module(model.embed)
    return model


def _scripted(budget_fraction, model=None, **kwargs):
    model = Decoder() if model is None else model
    probe = _ScalesWithLength(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_fraction=budget_fraction, probe=probe,
                                        backend="sim", min_offload_size=1024, **kwargs)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    return model, ctx, probe


def _peaks_as_planned(probe, joint):
    """Once planned, `probe` reads the plan's own predicted peak, scaled to
    the batch from the length it was made for (for plans that offload,
    which _ScalesWithLength leaves out)."""
    def peak():
        if joint.plan is None:
            return ScriptedProbe.peak(probe)
        ratio = joint.plan.get("for_ratio", 1.0)  # the race's own: 1
        return int(joint.plan["peak_bytes"] * probe.length / (probe.reference * ratio))
    probe.peak = peak


def _batch(length, seed):
    return torch.randn(2, length, 64, generator=torch.Generator().manual_seed(seed))


def _warmed_up(model, ctx, run=None):
    """The budget's profile and race on batches of 32 tokens, each step
    bit-identical to the same step without it (`run`: seeded_step unless
    given); returns how many ran (the next batch's seed)."""
    run = seeded_step if run is None else run
    it = 0
    while ctx.joint_budget.measuring:
        x = _batch(32, it)
        assert_identical(run(model, x), run(model, x, ctx))
        it += 1
    return it


def _by_keyword(model, x, ctx=None):
    torch.manual_seed(7)

    def forward(model, x):
        with ctx if ctx is not None else torch.enable_grad():
            return model(x=x)
    return train_step(model, x, forward)


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
    model = {"positional": Decoder, "a unit": _LayersFirst, "of one size": _FixedFirst,
             "compiled": _compiled_decoder, "compiled embedding": _compiled_embedding,
             }[first_call]()
    model, ctx, probe = _scripted(0.8, model, allow_offload=False)
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))
    run = _by_keyword if first_call in ("a unit", "of one size") else seeded_step
    hooked = []
    model.head.register_forward_pre_hook(
        lambda module, args: hooked.append(len(module_hooks._global_forward_pre_hooks)))

    def step(length):
        x = _batch(length, next(seed))
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
    model = {"positional": Decoder, "a unit": _LayersFirst, "compiled": _compiled_decoder,
             }[first_call](layers=6)
    model, ctx, probe = _scripted(0.8, model, allow_offload=False)
    joint = ctx.joint_budget
    run = _by_keyword if first_call == "a unit" else seeded_step
    seed = iter(range(10 ** 6))
    ran = []  # the plan in force at each budget step's head
    model.head.register_forward_pre_hook(
        lambda module, args: ran.append(joint.plan) if ctx._active else None)

    def step(length, within=True):
        x = _batch(length, next(seed))
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
    model, ctx, probe = _scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx)
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
            x = _batch(length, it)
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
    model, ctx, probe = _scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx)
    race = joint.unit_choices(joint._race.plan)
    assert "recompute" in race
    ran = []
    model.head.register_forward_pre_hook(
        lambda module, args: ran.append(joint.plan) if ctx._active else None)

    def step(length):
        nonlocal it
        x = _batch(length, it)
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
    model, ctx, probe = _scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx)
    forced = forced_plan(joint, {0: "keep", 1: "keep", 2: "keep", 3: "recompute"})
    assert not joint.same_plan(forced, joint._race.plan)
    joint._apply(forced)
    for length in (32, 32, 32):  # (a shorter batch may get a lighter plan of its own)
        x = _batch(length, it)
        it += 1
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert joint.plan is forced, length


def test_a_longer_batch_under_a_plan_that_offloads_is_planned_for_too():
    # Offloading allowed: the steady state keeps the engine and its unit
    # hooks; the plan for a batch of 48 is the one the race makes for it
    # (its predicted peak, at 48, within the budget), in force from that
    # batch's forward on, with the engine's loop made anew before its first
    # unit. Where the engine's hooks are in force for the whole forward
    # (torch < 2.8), the plan starts with the next forward (see the test
    # below). Per unit, batches of 32 and 48 then take turns, each on its
    # own plan and loop: the race's and the one made for 48, each kept (its
    # host buffers made), no other loop made; else every batch runs the
    # plan for 48. Steps bit-identical.
    model, ctx, probe = _scripted(0.75)
    per_unit = _common.saved_hooks_top() is not NotImplemented
    joint = ctx.joint_budget
    _peaks_as_planned(probe, joint)
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
            x = _batch(32, it)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert not joint.measuring and not joint.lean()
        assert "offload" in joint.plan["choice"], joint.plan["choice"]
        x = _batch(32, 999)  # the first forward after the warm-up
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        loop, before = ctx.offloader, len(made)
        pushed = _common.pushes(loop)
        for it, length in enumerate((48, 48, 32, 48)):
            x = _batch(length, 1000 + it)
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
    model, ctx, probe = _scripted(0.75)
    joint = ctx.joint_budget
    _peaks_as_planned(probe, joint)
    it = _warmed_up(model, ctx)
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
    x = _batch(32, it)
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))


def test_another_threads_module_call_is_not_taken_for_the_batch():
    # The first-call hook is global: a module another thread runs meanwhile
    # (an evaluation) is not this forward's first call. Here its batch is
    # 15 times the profiled one; the forward's own, 32 tokens, plans nothing.
    model, ctx, probe = _scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it, steady = 0, 0
    while steady < 2:  # the warm-up, and forwards after it: the first call's reference
        steady += not joint.measuring
        x = _batch(32, it)
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        it += 1
    assert joint.lengths._reference  # the hook is up in the next forward
    plan = joint.plan
    other = torch.nn.Linear(64, 64)
    x = _batch(32, it)
    reference = seeded_step(model, x)
    torch.manual_seed(7)
    for p in model.parameters():
        p.grad = None
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        with ctx:
            thread = threading.Thread(target=lambda: other(_batch(480, 0)))
            thread.start()
            thread.join()
            out = model(x)
        loss = (out.float() ** 2).mean()
        loss.backward()
    assert_identical(reference, (loss.detach(), [p.grad for p in model.parameters()]))
    assert joint.lengths.longest == 1.0 and joint.plan is plan


def test_a_longer_batch_under_the_callers_own_saved_tensor_hooks_leaves_them_in_force():
    # A caller's saved-tensor hooks pushed inside the context (a NoOpManager,
    # save_on_cpu) are innermost and win over the engine's. A longer batch
    # seen at the first call must not set the forward up again by popping
    # them in place of the engine's (torch < 2.8, where the engine's hooks
    # are in force for the whole forward): they see every tensor the
    # forward saves, the engine none, and the plan for 48 waits.
    model, ctx, probe = _scripted(0.75)
    joint = ctx.joint_budget
    _peaks_as_planned(probe, joint)
    it = _warmed_up(model, ctx)
    x = _batch(32, it)  # the reference for the first call
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert "offload" in joint.plan["choice"]
    packed = []

    def callers():
        return torch.autograd.graph.saved_tensors_hooks(
            lambda t: packed.append(1) or t, lambda t: t)
    loop = ctx.offloader
    pushed = _common.pushes(loop)
    x = _batch(48, it + 1)
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx, callers))
    assert len(packed) > 0
    assert _common.pushes(loop) == pushed
    assert ctx.offloader is loop or _common.pushes(ctx.offloader) == 0


def test_a_longer_batch_the_engine_cannot_plan_for_is_warned_about_and_runs():
    # Should the engine's planner fail for a longer batch (an OffloadError),
    # the forward does not: a warning says so and the plan in force runs.
    model, ctx, probe = _scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it = 0
    while joint.measuring or it < 1:
        x = _batch(32, it)
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        it += 1

    class Failing:
        def __init__(self, engine):
            self.engine = engine

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def for_batch(self, ratio):
            raise _common.ext().OffloadError("planned to fail")
    joint.lengths._engine, plan = Failing(joint.lengths._engine), joint.plan
    x = _batch(48, it)
    with pytest.warns(UserWarning, match="no plan for a batch 1.50 times .*planned to fail"):
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.plan is plan


def _settled_then_longer(length, **kwargs):
    """The warm-up on batches of 32 tokens, then two steps of one batch of
    `length`, which a plan made for it runs from the second: (model, ctx,
    probe, x, its step without the budget)."""
    model, ctx, probe = _scripted(0.8, allow_offload=False, **kwargs)
    it = _warmed_up(model, ctx)
    x = _batch(length, it)
    reference = seeded_step(model, x)
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    return model, ctx, probe, x, reference


def test_after_the_warm_up_a_plan_for_longer_batches_out_of_memory_gives_way():
    # After the warm-up on 32 tokens, batches of 40 run a plan made for
    # them; then the device holds less than that plan needs (memory beside
    # the model grew). A loop that skips the batch goes on with a plan for
    # 40 predicted lower (LongerBatches.out_of_memory, the engine's
    # PlanForLengthBelow), bit-identical; a batch of 32 runs the race's own
    # plan, and the next of 40 the lower one again. Before, only the race's
    # own plan gave way, and every step of 40 failed.
    model, ctx, probe, x, reference = _settled_then_longer(40)
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
    shorter = _batch(32, 999)
    assert_identical(seeded_step(model, shorter), seeded_step(model, shorter, ctx))
    assert joint.plan.get("length_id", 0) == 0
    assert joint.same_plan(joint.plan, joint._race.plan)
    assert_identical(reference, seeded_step(model, x, ctx))
    assert joint.plan["length_id"] == ran[1]["length_id"]


class _Quadratic(_ScalesWithLength):
    """A scripted device on which, once planned, a plan's bytes grow as the
    square of the batch's length (eager attention's scores), where the
    model takes them to grow as the length."""

    def peak(self):
        joint = self.ctx.joint_budget
        if joint.plan is None:
            return super().peak()
        d2h, h2d = joint.bandwidths
        at_reference = _common.ext().evaluate_joint(
            joint.model_units, d2h, h2d, 1 << 40, list(joint.plan["choice"]), True)
        return at_reference["peak_bytes"] * self.length ** 2 // self.reference ** 2


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
    model, ctx, probe = _scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx)
    probe.__class__ = _Quadratic
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
            x = _batch(length, it)
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


def test_in_the_race_a_longer_batch_over_the_budget_shows_how_the_bytes_grow():
    # On a device where a plan's bytes grow as the square of the batch's
    # length (eager attention's scores), every third batch of the race has
    # 40 tokens. Its step runs the race's plan (torch < 2.8) or one made for
    # it (torch >= 2.8) and peaks over the budget: the engine fits the
    # growth then (LongerBatches::RaceStepMeasured), so the plan the
    # warm-up's end makes for 40 grows so, and the first step of 40 after
    # the warm-up is within the budget, unwarned (GPU run 141: 569 MB for a
    # budget of 479), as is the first of 48. Every step bit-identical.
    model, ctx, probe = _scripted(0.8, Decoder(layers=6), allow_offload=False)
    probe.__class__ = _Quadratic
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))

    def step(length):
        x = _batch(length, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        return probe.peak()

    longer = 0
    while joint._race is None:
        step(32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        while joint.measuring:
            step(32)
            if joint.measuring and joint._race_iteration % 3 == 0:
                step(40)
                longer += 1
        assert longer >= 2
        assert joint._race.length_exponent == pytest.approx(2, abs=0.05)
        for length in (40, 32, 40, 48):
            assert step(length) <= joint.budget_bytes, length
    assert joint.plan["for_ratio"] == 1.5


def test_after_the_warm_up_the_smallest_plan_for_longer_batches_measured_over_names_the_budget_it_needs():
    # Batches of 160 tokens need more than the budget: their plan is the
    # smallest, warned about with the least budget. On a device where bytes
    # grow as the square of the length, its first step measures over even
    # that: a warning names the least budget at the growth measured, once;
    # the plan runs on (none is smaller), within that, and its checks end.
    model, ctx, probe = _scripted(0.8, allow_offload=False)
    it = _warmed_up(model, ctx)
    probe.__class__ = _Quadratic
    resets = []
    reset_peak = probe.reset_peak
    probe.reset_peak = lambda: (resets.append(it), reset_peak())
    with pytest.warns(UserWarning) as told:
        for _ in range(4):
            x = _batch(160, it)
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


class _HoldsOnlyOne(_ScalesWithLength):
    """A scripted device on which every plan but `only` (choices) peaks
    `extra` bytes above what the model predicts (the model's error at a
    length the race never ran), and which reads `over` for one step."""

    only, extra = None, 0

    def peak(self):
        joint = self.ctx.joint_budget
        wrong = joint.plan is not None and tuple(joint.plan["choice"]) != self.only
        return super().peak() + (self.extra if wrong and self.only else 0)


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
    model, ctx, probe, x, reference = _settled_then_longer(40, model=Decoder(layers=6))
    probe.__class__ = _HoldsOnlyOne
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
    model, ctx, probe, x, _ = _settled_then_longer(40, model=Decoder(layers=6))
    probe.__class__ = _HoldsOnlyOne
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
        model, ctx, probe, x, _ = _settled_then_longer(160)
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
    model, ctx, probe = _scripted(0.8, _LayersFirst(), allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx, _by_keyword)
    x = _batch(48, it)
    reference = _by_keyword(model, x)
    planned = joint._race.for_length(1.5)["choice"]
    assert planned != joint.plan["choice"]
    probe.capacity = joint.budget_bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(torch.cuda.OutOfMemoryError):
            _by_keyword(model, x, ctx)
        for _ in range(3):
            assert_identical(reference, _by_keyword(model, x, ctx))
    assert not caught, [str(w.message) for w in caught]
    assert joint.plan["choice"] == planned and joint.plan["for_ratio"] == 1.5


@pytest.mark.parametrize("allow_offload", [False, True])
def test_in_the_race_a_longer_batch_runs_a_plan_made_for_it_alone(allow_offload):
    # The race measures plans on 32 tokens; every fifth batch in it has 48.
    # Where the forward can be set up again before its first unit (torch ≥
    # 2.8), such a batch runs a plan made for 48 tokens, within the budget,
    # under an engine loop of its own; the next forward runs the race's
    # plan and loop again, and the race counts none of them. Everywhere,
    # the warm-up's end plans for the longest batch it saw: a batch of 48
    # after it runs the plan for 48, within the budget, and one of 32 the
    # race's own where its forward can be set up again at its first call. The race's plan for 48 is made once (the engine takes a
    # moment to plan), and its engine loop serves that plan after the
    # warm-up (its host buffers are made). Every step bit-identical to the same step without
    # the budget.
    model, ctx, probe = _scripted(0.75 if allow_offload else 0.8,
                                  allow_offload=allow_offload)
    joint = ctx.joint_budget
    if allow_offload:
        _peaks_as_planned(probe, joint)
    made, plan_made = [], joint.lengths._made  # (number, ratio) of each plan made

    def recorded(*args, **kwargs):
        plan = plan_made(*args, **kwargs)
        if plan:
            made.append((plan["length_id"], plan["for_ratio"]))
        return plan
    joint.lengths._made = recorded
    per_unit = _common.saved_hooks_top() is not NotImplemented
    in_force = []  # the engine's loop each forward ran, read at its head
    model.head.register_forward_pre_hook(lambda module, args: in_force.append(ctx.offloader))
    seed = iter(range(10 ** 6))

    def step(length):
        x = _batch(length, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        return probe.peak()

    longer, longer_loop = 0, (None, None)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        while joint._race is None:
            step(32)
        while joint.measuring:
            step(32)
            if not joint.measuring or joint._race_iteration % 3:
                continue
            loop, counted = ctx.offloader, joint._race_iteration
            peak = step(48)
            longer += 1
            assert joint._race_iteration == counted  # not one of the race's
            if per_unit:
                assert peak <= joint.budget_bytes
                assert in_force[-1] is not loop and joint.plan is not joint._race.plan
                longer_loop = (tuple(joint.plan["choice"]), in_force[-1])
            else:
                assert in_force[-1] is loop
            if joint.measuring:
                step(32)
                assert in_force[-1] is loop  # the race's, again
        assert longer >= 2 and len(set(made)) == 1 and made[0][1] == 1.5  # made once
        planned = joint._race.for_length(1.5)
        assert planned["needs_budget"] == 0
        # The first forward after the warm-up, of 32: it runs the race's own
        # plan where the forward can be set up again at its first call
        # (per unit, or lean to lean), else the one for 48, which fits it.
        assert step(32) <= joint.budget_bytes
        if per_unit or not allow_offload:
            assert joint.plan.get("length_id", 0) == 0
            assert joint.same_plan(joint.plan, joint._race.plan)
        else:
            assert joint.plan["choice"] == planned["choice"]
        assert step(48) <= joint.budget_bytes
        assert joint.plan["choice"] == planned["choice"] != joint._race.plan["choice"]
        if per_unit and longer_loop[0] == tuple(planned["choice"]):
            assert in_force[-1] is longer_loop[1]  # its host buffers made in the race


def _raising_once(module):
    """A list: where one is appended to it, `module`'s next forward raises
    RuntimeError("a bad batch") before it runs."""
    fail = []

    def raise_once(module, args):
        if fail:
            fail.pop()
            raise RuntimeError("a bad batch")
    module.register_forward_pre_hook(raise_once)
    return fail


def _accumulated(model, batches, ctx=None):
    """One step of gradient accumulation: every batch's forward (inside
    `ctx` where given), then one backward of their summed losses."""
    torch.manual_seed(7)
    for p in model.parameters():
        p.grad = None
    losses = []
    for x in batches:
        with ctx if ctx is not None else torch.enable_grad():
            losses.append((model(x).float() ** 2).mean())
    loss = sum(losses)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_after_the_warm_up_a_checked_plan_in_gradient_accumulation_or_raising_loses_nothing():
    # After the warm-up on 32 tokens, on a device where bytes grow as the
    # square of the length: the first batches of 40 come as two forwards
    # before one backward, then as a forward that raises midway (caught by
    # the loop), then as plain steps. Every step is bit-identical to the
    # same step without the budget; the check of the plan for 40 goes on
    # through them, and the plain steps end within the budget, warned once.
    model, ctx, probe = _scripted(0.8, Decoder(layers=6), allow_offload=False)
    joint = ctx.joint_budget
    it = _warmed_up(model, ctx)
    probe.__class__ = _Quadratic
    fail = _raising_once(model.layers[1])
    with pytest.warns(UserWarning) as told:
        batches = [_batch(40, it), _batch(40, it + 1)]
        assert_identical(_accumulated(model, batches), _accumulated(model, batches, ctx))
        fail.append(1)
        with pytest.raises(RuntimeError, match="a bad batch"):
            with ctx:
                model(_batch(40, it + 2))
        peaks = []
        for seed in range(it + 3, it + 9):
            x = _batch(40, seed)
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
    model, ctx, probe = _scripted(0.75 if allow_offload else 0.8, allow_offload=allow_offload)
    joint = ctx.joint_budget
    if allow_offload:
        _peaks_as_planned(probe, joint)
    it = _warmed_up(model, ctx)
    fail = _raising_once(model.layers[1])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        for length in (32, 48, 48):
            x = _batch(length, it)
            it += 1
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        assert joint.lengths.rungs() and joint.plan["for_ratio"] == 1.5
        batches = [_batch(32, it), _batch(48, it + 1), _batch(40, it + 2)]
        assert_identical(_accumulated(model, batches), _accumulated(model, batches, ctx))
        fail.append(1)
        with warnings.catch_warnings():  # (an offloading plan's loop says what it dropped)
            warnings.filterwarnings("ignore", message="actoffload: AbandonIteration")
            with pytest.raises(RuntimeError, match="a bad batch"):
                with ctx:
                    model(_batch(32, it + 3))
        for seed, length in enumerate((32, 48, 40, 32, 48), start=it + 4):
            x = _batch(length, seed)
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.plan["for_ratio"] == 1.5
    import gc
    gc.collect()
    loops = list(joint._loops.values()) + joint._retired + [ctx.offloader]
    assert all(loop.live_iterations() == 0 for loop in loops)


def test_in_the_race_a_longer_batch_in_gradient_accumulation_or_raising_loses_nothing():
    # In the race, under a plan that offloads: a batch of 48 between two
    # of 32 before one backward (its plan alone, torch ≥ 2.8, while theirs
    # are the race's); then a batch of 48 whose forward raises midway,
    # caught by the loop; after each, every step is bit-identical to the
    # same step without the budget, the race's plan and loop come back,
    # and the warm-up ends with a plan that fits.
    model, ctx, probe = _scripted(0.75)
    joint = ctx.joint_budget
    _peaks_as_planned(probe, joint)
    in_force = []
    model.head.register_forward_pre_hook(lambda module, args: in_force.append(ctx.offloader))
    fail = _raising_once(model.layers[1])
    seed = iter(range(10 ** 6))
    race_steps = 0
    while joint._race is None or race_steps < 2:  # the profile, then two of the race's
        race_steps += joint._race is not None
        x = _batch(32, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.measuring
    loop = ctx.offloader
    batches = [_batch(32, next(seed)), _batch(48, next(seed)), _batch(32, next(seed))]
    assert_identical(_accumulated(model, batches), _accumulated(model, batches, ctx))
    assert in_force[-1] is loop and (in_force[-2] is not loop) == (
        _common.saved_hooks_top() is not NotImplemented)
    fail.append(1)
    with pytest.raises(RuntimeError, match="a bad batch"):
        with ctx:
            model(_batch(48, next(seed)))
    while joint.measuring:
        x = _batch(32, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    x = _batch(48, next(seed))
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert probe.peak() <= joint.budget_bytes


class _SideFirst(Decoder):
    """Its forward's first positional tensor is a side input, whose size
    need not follow the batch's (a feature of its own length)."""

    def __init__(self):
        super().__init__()
        self.side = torch.nn.Linear(64, 64)

    def forward(self, side, x):
        return super().forward(x + self.side(side).mean(dim=1, keepdim=True))


def test_a_first_call_that_does_not_follow_the_batch_is_not_consulted_again():
    # In the race, a batch of 32 tokens whose side input has 48: the first
    # call says 1.5 times the profiled size; where the forward can be set up
    # again (torch ≥ 2.8) it runs a plan for that, which the race must not
    # count as its own plan's measurement (elsewhere the race's plan runs,
    # and counts). The first unit then shows the
    # batch is of the profiled size: the first call is not hooked again.
    model, ctx, probe = _scripted(0.8, _SideFirst(), allow_offload=False)
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))

    def step(side_length):
        x, side = _batch(32, next(seed)), _batch(side_length, next(seed))

        def forward(model, x, ctx=None):
            torch.manual_seed(7)
            with ctx if ctx is not None else torch.enable_grad():
                return model(side, x)
        got = train_step(model, x, lambda m, v: forward(m, v, ctx))
        assert_identical(train_step(model, x, forward), got)

    race_steps = 0
    while joint._race is None or race_steps < 2:  # the profile, then two of the race's
        race_steps += joint._race is not None
        step(32)
    assert joint.measuring and joint.lengths._reference
    counted, trials = joint._race_iteration, len(joint._all_trials)
    step(48)
    assert joint.lengths._reference is False
    if _common.saved_hooks_top() is not NotImplemented:  # the plan for 1.5 ran: not counted
        assert joint._race_iteration == counted and len(joint._all_trials) == trials
    else:  # the race's plan ran, on a batch like the profiled one: counted
        assert joint._race_iteration == counted + 1
    assert joint.lengths.seen == 1.0
