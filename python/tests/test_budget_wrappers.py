"""How the memory budget's wrappers sit on the units it recomputes (budget.py,
recompute.py), on the CPU and the simulated GPU with a scripted probe:
compiled units (the wrapper around their compiled call), a second budget on
the same model, and copies of the model (an EMA model, torch.save)."""

import io

import pytest
import torch

from actoffload import _common, recompute
from budget_testing import Decoder, compile_layers, make, seeded_step
from models import assert_identical


def test_a_compiled_units_sparse_views_stay_on_device():
    # The engine hands a view covering under half of the bytes it spans back
    # contiguous; a compiled unit's backward checks its saved tensors'
    # strides, so inside one (torch >= 2.8: hooks per unit) such a view is
    # kept as it is. Others go to the engine.
    handed = []
    pack = _common.keeps_layout(lambda t: handed.append(t) or "packed")
    qkv = torch.randn(4, 8, 3 * 16)
    query = qkv[..., :16].transpose(1, 2)  # a third of its projection's bytes
    kept = _common.unkeep(pack(query))  # a detached alias, same layout
    assert kept.data_ptr() == query.data_ptr() and kept.stride() == query.stride()
    assert handed == []
    assert pack(qkv) == "packed" and handed == [qkv]
    assert pack(qkv[..., :24]) == "packed"  # half: copied with its span
    assert pack(torch.empty(0, 4)[:, :1]) == "packed"  # nothing to copy


def test_compiled_units_offload_or_recompute_whole_around_their_compiled_call(monkeypatch):
    # Offload allowed: a plan of compiled units, bit-identical.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    compile_layers(model)
    ctx, _ = make(model, 0.6)
    for _ in range(6):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert "offload" in ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    # Recompute only: compiled units are recomputed whole (never
    # selectively), the checkpoint around their compiled call, outside the
    # compiled code (recompute.compiled), their forward their own.
    model = Decoder()
    reference = seeded_step(model, x)
    compile_layers(model)
    ctx, _ = make(model, 0.5, allow_offload=False)
    for _ in range(6):
        assert_identical(reference, seeded_step(model, x, ctx))
    joint = ctx.joint_budget
    choices = joint.unit_choices(joint.plan)
    assert "recompute" in choices and "selective" not in choices, choices
    assert all("selective" not in t[2]["choice"] for t in joint._all_trials)
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *a, **k: calls.append(k) or checkpoint(*a, **k))
    with ctx:
        out = model(x)
    for index, layer in enumerate(model.layers):
        assert "forward" not in layer.__dict__
        wrapped = isinstance(layer.__dict__["_compiled_call_impl"], recompute.Checkpointed)
        assert wrapped or choices[index] != "recompute", (index, choices)
    assert len(calls) == choices.count("recompute")
    assert all(k == {"use_reentrant": False} for k in calls), calls
    out.sum().backward()
    model(x).sum().backward()  # outside the context: their own compiled calls
    assert len(calls) == choices.count("recompute")


def test_a_second_budget_on_the_same_model_takes_the_first_ones_wrappers_off():
    # A loop that replaces its OffloadActivations (a new budget, the bench's
    # sweep): only the budget in use decides how the units run, and a unit
    # is never wrapped twice.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    first, _ = make(model, 0.5, allow_offload=False)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, first))
    assert "recompute" in first.joint_budget.unit_choices(first.joint_budget.plan)
    second, _ = make(model, 0.7, allow_offload=False)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, second))
    for layer in model.layers:
        wrapper = layer.__dict__.get("forward")
        assert wrapper is None or (wrapper.budget is second.joint_budget and
                                   not isinstance(wrapper.forward, type(wrapper)))
    for _ in range(2):  # the first again: its wrappers back on, the second's off
        assert_identical(reference, seeded_step(model, x, first))
    assert all(getattr(layer.__dict__.get("forward"), "budget", first.joint_budget)
               is first.joint_budget for layer in model.layers)


@pytest.mark.skipif(not hasattr(torch._C, "_current_graph_task_id"),
                    reason="torch < 2: no way to tell a re-run in the backward")
def test_a_layer_budget_after_a_block_budget_reruns_blocks_as_they_ran():
    # A block budget's wrappers stay on the attention and MLP modules; a layer
    # budget's recompute re-runs them inside the layer in its backward. They
    # must run there as they ran in that forward (plainly), not as their
    # own budget last planned, or the layer's checkpoint refuses the re-run.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    blocks, _ = make(model, 0.5, granularity="block", allow_offload=False)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, blocks))
    assert "recompute" in blocks.joint_budget.unit_choices(blocks.joint_budget.plan)
    layers, _ = make(model, 0.5, allow_offload=False)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, layers))
    assert "recompute" in layers.joint_budget.unit_choices(layers.joint_budget.plan)


def test_a_model_whose_units_the_budget_recomputes_can_be_copied_and_saved():
    # An EMA model (copy.deepcopy, torch.optim.swa_utils.AveragedModel) or
    # torch.save(model) after the budget wrapped units: the wrappers copy
    # as the units' own forwards (the engine cannot be copied: TypeError
    # "cannot pickle 'Session' object" before), and the copy trains as the
    # model does.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, _ = make(model, 0.5, allow_offload=False)
    for _ in range(6):
        seeded_step(model, x, ctx)
    assert "recompute" in ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert any(isinstance(layer.__dict__.get("forward"), recompute.Checkpointed)
               for layer in model.layers)
    for module in model.modules():  # the scripted probe's own hooks hold the budget
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copies = [torch.optim.swa_utils.AveragedModel(model).module,
              torch.load(buffer, weights_only=False)]
    for copied in copies:
        assert not any(isinstance(layer.__dict__.get("forward"), recompute.Checkpointed)
                       for layer in copied.layers)
        assert_identical(seeded_step(model, x), seeded_step(copied, x))
