"""Helpers of the memory budget's tests on batches of varying length
(test_budget_lengths.py, test_budget_rungs.py, test_budget_lengths_edge.py):
a scripted device whose bytes grow with the batch, models whose forward's
first call is not the batch's, the warm-up on batches of 32 tokens, and a
step of gradient accumulation."""

import torch

import actoffload
from actoffload import _common

from budget_testing import UNIT, Decoder, ScriptedProbe, compile_layers, compile_module, seeded_step
from models import assert_identical, train_step


class ScalesWithLength(ScriptedProbe):
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


class LayersFirst(Decoder):
    """Its forward's first module call that takes a tensor positionally is
    its first layer's (it is called by keyword)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        del self.embed

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)[0]
        return self.head(x)


class FixedFirst(Decoder):
    """Called by keyword, its forward's first module call takes a tensor of
    one size whatever the batch (a learned bias made from a buffer)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("position", torch.ones(1, 1, 64))

    def forward(self, x):
        return super().forward(x + self.embed(self.position))


def compiled_decoder(**kwargs):
    model = Decoder(**kwargs)
    compile_layers(model)
    return model


def compiled_embedding():
    model = Decoder()
    compile_module(model.embed)
    return model


def scripted(budget_fraction, model=None, **kwargs):
    model = Decoder() if model is None else model
    probe = ScalesWithLength(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_fraction=budget_fraction, probe=probe,
                                        backend="sim", min_offload_size=1024, **kwargs)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    return model, ctx, probe


def offloading(model=None, **kwargs):
    """scripted() at 0.75, where plans that offload fit, with the race
    restricted to them: at that budget RRKKK fits too, and the race picks
    by host-clock time, so a test whose premise is a plan that offloads
    must not leave it to the clock (docs/testing.md)."""
    return scripted(0.75, model, allow_recompute=False, **kwargs)


def peaks_as_planned(probe, joint):
    """Once planned, `probe` reads the plan's own predicted peak, scaled to
    the batch from the length it was made for (for plans that offload,
    which ScalesWithLength leaves out)."""
    def peak():
        if joint.plan is None:
            return ScriptedProbe.peak(probe)
        ratio = joint.plan.get("for_ratio", 1.0)  # the race's own: 1
        return int(joint.plan["peak_bytes"] * probe.length / (probe.reference * ratio))
    probe.peak = peak


def tokens(length, seed):
    return torch.randn(2, length, 64, generator=torch.Generator().manual_seed(seed))


def warmed_up(model, ctx, run=None):
    """The budget's profile and race on batches of 32 tokens, each step
    bit-identical to the same step without it (`run`: seeded_step unless
    given); returns how many ran (the next batch's seed)."""
    run = seeded_step if run is None else run
    it = 0
    while ctx.joint_budget.measuring:
        x = tokens(32, it)
        assert_identical(run(model, x), run(model, x, ctx))
        it += 1
    return it


def by_keyword(model, x, ctx=None):
    torch.manual_seed(7)

    def forward(model, x):
        with ctx if ctx is not None else torch.enable_grad():
            return model(x=x)
    return train_step(model, x, forward)


def settled_then_longer(length, **kwargs):
    """The warm-up on batches of 32 tokens, then two steps of one batch of
    `length`, which a plan made for it runs from the second: (model, ctx,
    probe, x, its step without the budget)."""
    model, ctx, probe = scripted(0.8, allow_offload=False, **kwargs)
    it = warmed_up(model, ctx)
    x = tokens(length, it)
    reference = seeded_step(model, x)
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    return model, ctx, probe, x, reference


class Quadratic(ScalesWithLength):
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


class HoldsOnlyOne(ScalesWithLength):
    """A scripted device on which every plan but `only` (choices) peaks
    `extra` bytes above what the model predicts (the model's error at a
    length the race never ran), and which reads `over` for one step."""

    only, extra = None, 0

    def peak(self):
        joint = self.ctx.joint_budget
        wrong = joint.plan is not None and tuple(joint.plan["choice"]) != self.only
        return super().peak() + (self.extra if wrong and self.only else 0)


def raising_once(module):
    """A list: where one is appended to it, `module`'s next forward raises
    RuntimeError("a bad batch") before it runs."""
    fail = []

    def raise_once(module, args):
        if fail:
            fail.pop()
            raise RuntimeError("a bad batch")
    module.register_forward_pre_hook(raise_once)
    return fail


def accumulated(model, batches, ctx=None):
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
