"""The memory budget (budget.py) on batches of varying length, as dynamic
padding feeds them, on the CPU and the simulated GPU with a scripted probe:
the profile and the race measure batches of one length (SHAPE_PATIENCE)."""

import warnings

import torch

import actoffload
from budget_testing import UNIT, Decoder, ScriptedProbe, make, seeded_step
from models import assert_identical


class _ScalesWithLength(ScriptedProbe):
    """A scripted device whose every byte grows with the batch's sequence
    length: its figures are those of a batch of `reference` tokens."""

    reference = 32

    def __init__(self, *args, **kwargs):
        self.length = self.reference
        super().__init__(*args, **kwargs)

    def watch(self, units):
        super().watch(units)
        units[0].register_forward_pre_hook(
            lambda module, args: setattr(self, "length", args[0].shape[1]))

    def _scaled(self, name):
        return self.__dict__["_" + name] * self.length // self.reference

    unit_bytes = property(lambda self: self._scaled("unit_bytes"),
                          lambda self, v: self.__dict__.__setitem__("_unit_bytes", v))
    selective_bytes = property(lambda self: self._scaled("selective_bytes"),
                               lambda self, v: self.__dict__.__setitem__("_selective_bytes", v))
    outside = property(lambda self: self._scaled("outside"),
                       lambda self, v: self.__dict__.__setitem__("_outside", v))

    def peak(self):
        joint = self.ctx.joint_budget
        if joint.plan is not None:
            return joint.plan["peak_bytes"] * self.length // self.reference + self.over
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
    # depends on its measured steps, here the CPU's: not compared.
    model = Decoder()
    probe = _ScalesWithLength(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6, probe=probe,
                                        backend="sim", min_offload_size=1024)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    joint = ctx.joint_budget
    lengths = (32, 64, 16, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for it in range(120):
            x = torch.randn(2, lengths[it % len(lengths)], 64,
                            generator=torch.Generator().manual_seed(it))
            assert_identical(seeded_step(model, x), seeded_step(model, x, ctx))
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
