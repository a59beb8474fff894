"""Selective recompute, the budget's fourth choice (SPEC §4.8, issue 30):
a unit run under torch.utils.checkpoint with a selective policy saves the
outputs of its costly ops (matmuls, attention) and re-runs only the cheap
ones (norms, activations, softmax) before its backward. Needs a torch with
selective-checkpoint policies (>= 2.4: the GPU machine's; CI's 1.13 skips)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from actoffload import _common, budget_profile, recompute
from budget_testing import (UNIT, Decoder, Layer, forced_plan, make, profile,
                            seeded_step)
from models import assert_identical

pytestmark = pytest.mark.skipif(not recompute.selective_available(),
                                reason="needs torch >= 2.4 (selective checkpoint)")

_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket.__name__ in _MATMULS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Budget:
    """What a Checkpointed wrapper asks of its budget: how its unit runs."""

    def __init__(self, mode):
        self.mode = mode

    def checkpoints(self, index):
        return self.mode


def _backward_matmuls(mode, hidden=32, tokens=16):
    """(matmuls the backward of one layer runs, its input's gradient)."""
    torch.manual_seed(0)
    layer = Layer(hidden)
    if mode is not None:
        layer.forward = recompute.Checkpointed(_Budget(mode), 0, layer.forward)
    x = torch.randn(2, tokens, hidden, requires_grad=True)
    torch.manual_seed(7)  # the same dropout masks
    out = layer(x)[0]
    counter = _CountMatmuls()
    with counter:
        out.sum().backward()
    return counter.count, x.grad


def test_a_selective_unit_reruns_its_cheap_ops_and_no_matmul():
    plain, plain_grad = _backward_matmuls(None)
    full, full_grad = _backward_matmuls("recompute")
    selective, selective_grad = _backward_matmuls("selective")
    # The whole re-run repeats the forward's matmuls; the selective one
    # repeats none of them (their outputs were saved), only what lies between.
    assert full > plain
    assert selective == plain
    assert torch.equal(full_grad, plain_grad)
    assert torch.equal(selective_grad, plain_grad)


def test_a_selective_unit_reruns_the_attention_scores_of_a_long_sequence():
    # 256 tokens over a head of 16: the scores (query times key) have 8
    # times the elements of query and key together, cheap to make again
    # for their bytes; the selective re-run repeats that one matmul and no
    # linear layer's.
    plain, plain_grad = _backward_matmuls(None, hidden=16, tokens=256)
    selective, selective_grad = _backward_matmuls("selective", hidden=16, tokens=256)
    assert selective == plain + 1
    assert torch.equal(selective_grad, plain_grad)


class _AttentionWithDropout(torch.nn.Module):
    """GPT-2's attention with SDPA: the kernel's own dropout, then the
    residual dropout after the projection, both drawing from the RNG."""

    def __init__(self, hidden=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2)
                   for y in self.qkv(x).split(h, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.5,
                                                             is_causal=True)
        y = self.proj(y.transpose(1, 2).reshape(b, t, h))
        return torch.nn.functional.dropout(y, 0.5, training=True) + x


def test_a_selective_unit_with_dropout_inside_attention_stays_bit_identical():
    # Saved, the attention kernel would not draw in the re-run, and the
    # residual dropout after it would draw other numbers than the forward's.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    grads = {}
    for mode in (None, "selective", "recompute"):
        torch.manual_seed(0)
        unit = _AttentionWithDropout().to(device)
        if mode is not None:
            unit.forward = recompute.Checkpointed(_Budget(mode), 0, unit.forward)
        x = torch.randn(2, 64, 32, device=device, requires_grad=True)
        torch.manual_seed(7)
        unit(x).square().sum().backward()
        grads[mode] = [x.grad] + [p.grad for p in unit.parameters()]
    for mode in ("selective", "recompute"):
        assert all(torch.equal(a, b) for a, b in zip(grads[None], grads[mode])), mode


def test_a_selective_unit_backs_up_twice_with_retain_graph():
    # PyTorch's selective checkpoint refuses a second backward through the
    # same forward; a budget's unit must not (SPEC §7: retain_graph).
    def grads(mode):
        torch.manual_seed(0)
        layer = Layer(32)
        if mode is not None:
            layer.forward = recompute.Checkpointed(_Budget(mode), 0, layer.forward)
        x = torch.randn(2, 16, 32)
        torch.manual_seed(7)
        loss = layer(x)[0].square().sum()
        loss.backward(retain_graph=True)
        loss.backward()
        return [p.grad for p in layer.parameters()]
    plain = grads(None)
    for mode in ("selective", "recompute"):
        assert all(torch.equal(a, b) for a, b in zip(plain, grads(mode))), mode


def test_the_budget_plans_selective_where_it_frees_bytes_cheaply(monkeypatch):
    # A selective unit leaves a quarter of its bytes (the scripted probe)
    # and its re-run takes a twentieth of its forward: at 0.7 of the peak
    # without offloading, recomputing selectively is the plan the model
    # predicts fastest, the race's first. (The re-run's time is set: on CPU
    # tensors this small, the policy's dispatch costs more than the ops it
    # spares, and the race may then keep a whole re-run.)
    monkeypatch.setattr(budget_profile, "_selective_gains",
                        lambda selective, kept, fwd, *args: [0.05] * len(fwd))
    model = Decoder(layers=4)
    x = torch.randn(2, 16, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.7, selective_bytes=UNIT // 4, allow_offload=False)
    assert profile(model, x, ctx, reference) == 3  # all, every unit selective, recomputed
    budget = ctx.joint_budget
    units = [budget.profile["units"][place] for place in budget._index]
    assert all(u["selective"] and u["selective_bytes"] == UNIT // 4 and
               u["selective_ns"] == pytest.approx(0.05 * u["forward_ns"]) for u in units)
    assert "selective" in budget.unit_choices(budget.plan), budget.describe()
    while budget.measuring:  # the race runs it, then the others: all bit-identical
        assert_identical(reference, seeded_step(model, x, ctx))
    assert any("selective" in budget.unit_choices(plan) for _, _, plan in budget.trials)


def test_no_selective_choice_where_recompute_is_not_allowed():
    model = Decoder(layers=4)
    x = torch.randn(2, 16, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.5, selective_bytes=UNIT // 4, allow_recompute=False)
    assert profile(model, x, ctx, reference) == 1  # no selective profile iteration
    for _ in range(3):
        assert_identical(reference, seeded_step(model, x, ctx))
    budget = ctx.joint_budget
    assert all("selective" not in u for u in budget.profile["units"])
    assert "selective" not in budget.unit_choices(budget.plan)


def _warmed_up(model):
    """(x, reference step, context, its budget) for `model` under a budget
    of 0.9 whose warm-up is over, every step of it bit-identical."""
    x = torch.randn(2, 16, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.9, selective_bytes=UNIT // 4)
    profile(model, x, ctx, reference)
    while ctx.joint_budget.measuring:
        assert_identical(reference, seeded_step(model, x, ctx))
    return x, reference, ctx, ctx.joint_budget


def test_a_selective_offload_unit_sends_its_saved_outputs_through_the_engine():
    # Units 0 and 1 selective, their saved matmul outputs offloaded: the
    # engine's loop copies them out and back (its bytes_offloaded), the step
    # stays bit-identical, twice with retain_graph too, and a unit only
    # selective copies nothing.
    model = Decoder(layers=4)
    x, reference, ctx, budget = _warmed_up(model)
    copied = {}
    for choice in ("selective", "selective-offload"):
        budget._apply(forced_plan(budget, {0: choice, 1: choice, 2: "keep", 3: "keep"}))
        assert budget.unit_choices(budget.plan)[:2] == [choice, choice]
        before = ctx.offloader.stats()["bytes_offloaded"]
        for _ in range(2):
            assert_identical(reference, seeded_step(model, x, ctx))
        copied[choice] = ctx.offloader.stats()["bytes_offloaded"] - before
    assert copied["selective"] == 0
    # Each layer's matmul outputs: qkv (3 x 8 KiB), the scores, attention
    # times v, out, up (32 KiB), down; two layers, two steps.
    assert copied["selective-offload"] >= 2 * 2 * (3 + 1 + 1 + 4 + 1) * 8192, copied

    def grads(ctx):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        if ctx is None:
            loss = model(x).square().sum()
        else:
            with ctx:
                loss = model(x).square().sum()
        loss.backward(retain_graph=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]
    plain = grads(None)
    assert all(torch.equal(a, b) for a, b in zip(plain, grads(ctx)))


def test_selective_offload_units_under_an_outer_checkpoint_stay_bit_identical():
    # Hugging Face's gradient checkpointing around each layer: its hooks win
    # over the units' own, so a selective-offload unit keeps its outputs
    # on device, as an offloaded unit does (budget.JointBudget.loop), in the
    # forward and in the checkpoint's re-run; every step bit-identical.
    from budget_testing import CheckpointedDecoder
    model = CheckpointedDecoder(layers=4)
    x, reference, ctx, budget = _warmed_up(model)
    budget._apply(forced_plan(budget, {0: "selective-offload", 1: "selective-offload"}))
    before = ctx.offloader.stats()["bytes_offloaded"]
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    if _common.saved_hooks_top() is not NotImplemented:  # per-unit hooks (torch >= 2.8)
        assert ctx.offloader.stats()["bytes_offloaded"] == before


def test_an_exception_inside_a_selective_offload_unit_then_steps_as_usual():
    # A bad batch raises inside unit 0's MLP, after its attention's matmul
    # outputs went to the engine's loop: nothing stays in force, the loop is
    # not stuck, and the next steps are bit-identical and copy again.
    model = Decoder(layers=4)
    x, reference, ctx, budget = _warmed_up(model)
    budget._apply(forced_plan(budget, {0: "selective-offload", 1: "selective-offload"}))
    assert_identical(reference, seeded_step(model, x, ctx))
    mlp = model.layers[0].mlp
    mlp.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad batch"))
    with pytest.raises(RuntimeError, match="bad batch") as raised:
        seeded_step(model, x, ctx)
    del mlp.forward
    # While the exception lives (its traceback holds PyTorch's checkpoint),
    # neither the checkpoint's hooks and selective mode nor the engine's
    # hooks below them stay in force (_common.close_abandoned_checkpoints).
    assert _common.saved_hooks_top() in (None, NotImplemented)
    assert torch._C._len_torch_dispatch_stack() == 0
    del raised
    before = ctx.offloader.stats()["bytes_offloaded"]
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.offloader.stats()["bytes_offloaded"] > before
    assert ctx.offloader.live_iterations() == 0


def test_forwards_without_a_backward_beside_selective_offload_units():
    # An eval pass with grad on (its graph dropped, never backed up), one
    # under no_grad and one under inference_mode, between training steps:
    # each returns what the plain model does, and the steps after them stay
    # bit-identical with nothing left live.
    model = Decoder(layers=4)
    x, reference, ctx, budget = _warmed_up(model)
    budget._apply(forced_plan(budget, {0: "selective-offload", 1: "selective",
                                       2: "selective-offload"}))
    model.eval()
    with torch.no_grad():
        expected = model(x)
    for grad_mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with grad_mode(), ctx:
            out = model(x)
        assert torch.equal(out, expected), grad_mode
        del out
    model.train()
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.offloader.live_iterations() == 0
