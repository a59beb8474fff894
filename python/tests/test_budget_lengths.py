"""The memory budget (budget.py) on batches of varying length, as dynamic
padding feeds them, on the CPU and the simulated GPU with a scripted probe
(lengths_testing.py): the profile and the race measure batches of one
length (SHAPE_PATIENCE); in the race a longer batch runs a plan made for
the longest seen, and the forward's first call is taken for the batch only
where it follows it. After the warm-up: test_budget_rungs.py (a plan per
length) and test_budget_lengths_edge.py (steps over the budget or out of
memory)."""

import threading
import warnings

import pytest
import torch

import actoffload
from actoffload import _common

from budget_testing import UNIT, Decoder, make, seeded_step
from lengths_testing import (Quadratic, ScalesWithLength, accumulated, offloading,
                             peaks_as_planned, raising_once, scripted, tokens, warmed_up)
from models import assert_identical, train_step


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
    probe = ScalesWithLength(UNIT, outside=UNIT)
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


def test_another_threads_module_call_is_not_taken_for_the_batch():
    # The first-call hook is global: a module another thread runs meanwhile
    # (an evaluation) is not this forward's first call. Here its batch is
    # 15 times the profiled one; the forward's own, 32 tokens, plans nothing.
    model, ctx, probe = scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it, steady = 0, 0
    while steady < 2:  # the warm-up, and forwards after it: the first call's reference
        steady += not joint.measuring
        x = tokens(32, it)
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
        it += 1
    assert joint.lengths._reference  # the hook is up in the next forward
    plan = joint.plan
    other = torch.nn.Linear(64, 64)
    x = tokens(32, it)
    reference = seeded_step(model, x)
    torch.manual_seed(7)
    for p in model.parameters():
        p.grad = None
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="actoffload")
        with ctx:
            thread = threading.Thread(target=lambda: other(tokens(480, 0)))
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
    model, ctx, probe = offloading()
    joint = ctx.joint_budget
    peaks_as_planned(probe, joint)
    it = warmed_up(model, ctx)
    x = tokens(32, it)  # the reference for the first call
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert "offload" in joint.plan["choice"]
    packed = []

    def callers():
        return torch.autograd.graph.saved_tensors_hooks(
            lambda t: packed.append(1) or t, lambda t: t)
    loop = ctx.offloader
    pushed = _common.pushes(loop)
    x = tokens(48, it + 1)
    assert_identical(seeded_step(model, x), seeded_step(model, x, ctx, callers))
    assert len(packed) > 0
    assert _common.pushes(loop) == pushed
    assert ctx.offloader is loop or _common.pushes(ctx.offloader) == 0


def test_a_longer_batch_the_engine_cannot_plan_for_is_warned_about_and_runs():
    # Should the engine's planner fail for a longer batch (an OffloadError),
    # the forward does not: a warning says so and the plan in force runs.
    model, ctx, probe = scripted(0.8, allow_offload=False)
    joint = ctx.joint_budget
    it = 0
    while joint.measuring or it < 1:
        x = tokens(32, it)
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
    x = tokens(48, it)
    with pytest.warns(UserWarning, match="no plan for a batch 1.50 times .*planned to fail"):
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.plan is plan


def test_in_the_race_a_longer_batch_over_the_budget_shows_how_the_bytes_grow():
    # On a device where a plan's bytes grow as the square of the batch's
    # length (eager attention's scores), every third batch of the race has
    # 40 tokens. Its step runs the race's plan (torch < 2.8) or one made for
    # it (torch >= 2.8) and peaks over the budget: the engine fits the
    # growth then (LongerBatches::RaceStepMeasured), so the plan the
    # warm-up's end makes for 40 grows so, and the first step of 40 after
    # the warm-up is within the budget, unwarned (GPU run 141: 569 MB for a
    # budget of 479), as is the first of 48. Every step bit-identical.
    model, ctx, probe = scripted(0.8, Decoder(layers=6), allow_offload=False)
    probe.__class__ = Quadratic
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))

    def step(length):
        x = tokens(length, next(seed))
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
    model, ctx, probe = (offloading() if allow_offload else
                          scripted(0.8, allow_offload=False))
    joint = ctx.joint_budget
    if allow_offload:
        peaks_as_planned(probe, joint)
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
        x = tokens(length, next(seed))
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


def test_in_the_race_a_longer_batch_in_gradient_accumulation_or_raising_loses_nothing():
    # In the race, under a plan that offloads: a batch of 48 between two
    # of 32 before one backward (its plan alone, torch ≥ 2.8, while theirs
    # are the race's); then a batch of 48 whose forward raises midway,
    # caught by the loop; after each, every step is bit-identical to the
    # same step without the budget, the race's plan and loop come back,
    # and the warm-up ends with a plan that fits.
    model, ctx, probe = offloading()
    joint = ctx.joint_budget
    peaks_as_planned(probe, joint)
    in_force = []
    model.head.register_forward_pre_hook(lambda module, args: in_force.append(ctx.offloader))
    fail = raising_once(model.layers[1])
    seed = iter(range(10 ** 6))
    race_steps = 0
    while joint._race is None or race_steps < 2:  # the profile, then two of the race's
        race_steps += joint._race is not None
        x = tokens(32, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    assert joint.measuring
    loop = ctx.offloader
    batches = [tokens(32, next(seed)), tokens(48, next(seed)), tokens(32, next(seed))]
    assert_identical(accumulated(model, batches), accumulated(model, batches, ctx))
    assert in_force[-1] is loop and (in_force[-2] is not loop) == (
        _common.saved_hooks_top() is not NotImplemented)
    fail.append(1)
    with pytest.raises(RuntimeError, match="a bad batch"):
        with ctx:
            model(tokens(48, next(seed)))
    while joint.measuring:
        x = tokens(32, next(seed))
        assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
    x = tokens(48, next(seed))
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
    model, ctx, probe = scripted(0.8, _SideFirst(), allow_offload=False)
    joint = ctx.joint_budget
    seed = iter(range(10 ** 6))

    def step(side_length):
        x, side = tokens(32, next(seed)), tokens(side_length, next(seed))

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
