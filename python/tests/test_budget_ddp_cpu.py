"""The memory budget (budget.py) under DistributedDataParallel, on CPU torch
with two gloo processes, the simulated GPU and a scripted probe
(budget_testing.ScriptedProbe): OffloadActivations(ddp_model,
budget_fraction=...) finds the units inside the wrapper, each rank profiles
and races on its own, and every step's loss and averaged gradients are
bit-identical to the same DDP model without the context, through the
profile, the race and the steady state. The two-process
launcher is pipeline_cpu_testing.run_two_ranks."""

import copy

import pytest
import torch

from actoffload import budget
from budget_testing import Decoder, make, seeded_step
from models import assert_identical
from pipeline_cpu_testing import run_two_ranks


def scenario_ddp_budget(rank):
    """One rank: a DDP decoder under a budget of 0.6 of its no-offload peak
    (recompute and offload both allowed), beside the same DDP decoder
    without it, on the rank's own batch."""
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = Decoder()
    plain = DistributedDataParallel(copy.deepcopy(model))
    wrapped = DistributedDataParallel(model)
    ctx, _ = make(wrapped, 0.6)
    torch.manual_seed(100 + rank)
    x = torch.randn(2, 32, 64)
    plans = []
    for _ in range(budget.WARMUP_ITERATIONS + 3):
        expected = seeded_step(plain, x)
        assert_identical(expected, seeded_step(wrapped, x, ctx))
        if ctx.joint_budget.plan is not None:
            plans.append(tuple(ctx.joint_budget.plan["choice"]))
    units = ctx.joint_budget.units
    return {"units": [type(u).__name__ for u in units],
            "inside": all(any(u is m for m in model.modules()) for u in units),
            "settled": ctx.joint_budget._settled, "plans": plans,
            "grad": [p.grad.clone() for p in wrapped.parameters()]}


def test_a_budget_under_ddp_is_bit_identical_on_both_ranks(tmp_path):
    results = run_two_ranks(scenario_ddp_budget, tmp_path)
    for result in results:
        assert result["units"] == ["Layer"] * 4 and result["inside"], result["units"]
        assert result["settled"]
        # (Which plans the race runs depends on each rank's timings: on a
        # busy machine it may keep its first, the others pruned.)
        assert set(result["plans"][-1]) != {"keep"}, result["plans"][-1]
    # The averaged gradients are the same on both ranks (each rank's plan
    # is its own; what they compute is not).
    for a, b in zip(results[0]["grad"], results[1]["grad"]):
        assert torch.equal(a, b)
