"""OffloadActivations(model, budget_bytes=...) with a memory probe: the
joint keep / offload / recompute plan (SPEC §4.8, §7.8; budget.py) on the
CPU and the simulated GPU. The probe here is scripted (CPU tensors have no
allocator counters): each unit leaves `unit_bytes` allocated, and the step's
peak is the units' bytes (once planned, the plan's predicted peak), `outside`
more, and what the test adds. The GPU tests (test_gpu_budget.py) measure
for real."""

import pytest
import torch
import torch.nn.functional as F

import actoffload
from actoffload import _common, budget
from models import assert_identical, train_step


class ScriptedProbe:
    """A device whose allocator the test scripts. Each unit's forward leaves
    `unit_bytes` allocated until its backward has run; while the units'
    backward runs, the step holds `outside` bytes more (a transient). Once
    planned, a peak reads what the plan predicts, plus `over`."""

    def __init__(self, unit_bytes, outside, glue=0):
        self.unit_bytes = unit_bytes
        self.outside = outside
        self.glue = glue   # left allocated between two units' forwards
        self.glued = 0
        self.over = 0
        self.now = 0       # allocated
        self.top = 0       # the peak since the last reset
        self.held = []     # units whose bytes are allocated, forward order
        self.in_backward = False
        self.ctx = None    # the OffloadActivations whose plan the device follows

    def watch(self, units):
        for index, unit in enumerate(units):
            unit.register_forward_hook(self._forward_ended(index))
            if index > 0:
                unit.register_forward_pre_hook(self._glue)

    def _glue(self, module, args):
        if torch.is_grad_enabled() and not _common.in_backward():
            self.now += self.glue
            self.glued += self.glue
            self.top = max(self.top, self.now)

    def _forward_ended(self, index):
        def hook(module, args, output):
            if not torch.is_grad_enabled() or _common.in_backward():
                return  # a recompute's re-run: its bytes are the backward's
            self.now += self.unit_bytes
            self.held.append(index)
            self.top = max(self.top, self.now)
            tensor = _common.first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(lambda grad: self._backward_begins(index))
        return hook

    def _backward_begins(self, index):
        while self.held and self.held[-1] > index:  # their backward has run
            self.held.pop()
            self.now -= self.unit_bytes
        if not self.in_backward:
            self.in_backward = True
            # Queued from a callback, so that it runs after every callback
            # queued during the backward (the budget reads the step's end).
            queue = torch.autograd.Variable._execution_engine.queue_callback
            queue(lambda: queue(self._step_ended))

    def _step_ended(self):
        self.in_backward = False
        self.now -= self.unit_bytes * len(self.held) + self.glued
        self.held, self.glued = [], 0

    def allocated(self):
        return self.now

    def peak(self):
        joint = self.ctx.joint_budget if self.ctx is not None else None
        if joint is not None and joint.plan is not None:
            return joint.plan["peak_bytes"] + self.over
        return max(self.top, self.now) + (self.outside if self.in_backward else 0) + self.over

    def reset_peak(self):
        self.top = self.now


class Attention(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
        return self.out(F.dropout(attn, 0.1, self.training) @ v)


class Mlp(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.down(F.dropout(F.gelu(self.up(x)), 0.1, self.training))


class Layer(torch.nn.Module):
    """A decoder layer as Hugging Face names its blocks."""

    def __init__(self, hidden):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.self_attn = Attention(hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return (x + self.mlp(self.norm2(x)),)  # a tuple, as Hugging Face's


class Decoder(torch.nn.Module):
    def __init__(self, layers=4, hidden=64):
        super().__init__()
        self.embed = torch.nn.Linear(hidden, hidden)
        self.layers = torch.nn.ModuleList(Layer(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)[0]
        return self.head(x)


def seeded_step(model, x, ctx=None):
    torch.manual_seed(7)  # the same dropout masks in every step

    def forward(model, x):
        with ctx:
            return model(x)
    return train_step(model, x, None if ctx is None else forward)


UNIT = 1 << 20  # the scripted bytes each unit leaves allocated


def make(model, budget_fraction, outside=UNIT, **kwargs):
    probe = ScriptedProbe(UNIT, outside=outside)
    ctx = actoffload.OffloadActivations(
        model, budget_fraction=budget_fraction, probe=probe, backend="sim",
        min_offload_size=1024, **kwargs)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    return ctx, probe


def test_checkpoint_only_plan_recomputes_and_stays_bit_identical(monkeypatch):
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.6, allow_offload=False)
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    choice = ctx.joint_budget.plan["choice"]
    assert "recompute" in choice and "offload" not in choice, choice
    assert ctx.budget_plan().count("recompute") >= choice.count("recompute")
    # Outside the context the units run their own forwards, without
    # checkpoint; inside, the plan's recomputed units run under it.
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    model(x).sum().backward()
    assert calls == []
    recomputed = ctx.joint_budget.unit_choices(ctx.joint_budget.plan).count("recompute")
    with ctx:
        out = model(x)
    assert len(calls) == recomputed > 0
    out.sum().backward()


@pytest.mark.skipif(not hasattr(torch._C, "_current_graph_task_id"),
                    reason="torch < 2: no way to tell a re-run in the backward")
def test_units_under_an_outer_checkpoint_rerun_as_their_forward_ran():
    # Hugging Face's gradient checkpointing wraps each layer's call in a
    # non-reentrant checkpoint; its re-run in the backward (after the
    # context's exit) must save what the forward saved, or it refuses it.
    class Checkpointed(Decoder):
        def forward(self, x):
            x = self.embed(x)
            for layer in self.layers:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)[0]
            return self.head(x)
    model = Checkpointed()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.6, allow_offload=False)
    for _ in range(8):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert "recompute" in ctx.joint_budget.unit_choices(ctx.joint_budget.plan)


def test_offload_only_plan_offloads_on_the_simulated_gpu():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.7, allow_recompute=False)
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    choice = ctx.joint_budget.plan["choice"]
    assert "offload" in choice and "recompute" not in choice, choice
    assert ctx.offloader.stats()["bytes_offloaded"] > 0
    # The limit (engine/joint_limit.h) never exceeds the plan's prediction.
    limit = ctx.joint_budget.limit()
    assert 0 < limit <= ctx.joint_budget.plan["step_ns"]
    assert ctx.session.hazards() == []


def test_blocks_are_units_and_mixed_plans_stay_bit_identical():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, granularity="block")
    assert [type(u).__name__ for u in ctx.joint_budget.units] == ["Attention", "Mlp"] * 4
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert set(ctx.joint_budget.plan["choice"]) != {"keep"}
    with pytest.raises(ValueError, match="granularity"):
        actoffload.OffloadActivations(model, budget_bytes=1 << 20, probe=ScriptedProbe(1, 1),
                                      granularity="op", backend="sim")


def test_what_code_between_units_leaves_is_glue_the_plan_counts():
    # Blocks leave norms and residual adds between them: glue, one more
    # unit of the plan each, neither offloaded nor recomputed, and counted
    # in the plan's peak.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    probe = ScriptedProbe(UNIT, outside=0, glue=UNIT // 2)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6, probe=probe,
                                        granularity="block", backend="sim",
                                        min_offload_size=1024)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, ctx))
    joint = ctx.joint_budget
    units = joint.profile["units"]
    assert len(units) == 8 + 7 + 1  # blocks, glue between them, the head
    glue = [u for i, u in enumerate(units[:-1]) if i not in joint._index]
    assert [u["saved_bytes"] for u in glue] == [UNIT // 2] * 7
    assert all(not u["offloadable"] and not u["recomputable"] for u in glue)
    assert all(joint.plan["choice"][i] == "keep" for i in range(15) if i not in joint._index)
    assert len(joint.unit_choices(joint.plan)) == 8
    # Without the glue the plan would need 3.5 units less.
    assert joint.plan["peak_bytes"] >= 7 * (UNIT // 2)


def test_a_budget_no_plan_fits_is_refused_once_naming_the_smallest():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    probe = ScriptedProbe(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_bytes=UNIT // 2, probe=probe,
                                        backend="sim", min_offload_size=1024)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    assert_identical(reference, seeded_step(model, x, ctx))  # the profile
    with pytest.raises(ValueError, match=r"smallest that fits is \d+ bytes"):
        seeded_step(model, x, ctx)
    for _ in range(3):  # planned for the smallest: runs, bit-identical
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.joint_budget.plan is not None


def test_a_measured_peak_over_the_budget_lowers_the_plan():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8)
    seeded_step(model, x, ctx)  # the profile
    joint = ctx.joint_budget
    first_budget = joint._units_budget
    # Every candidate's peak reads at least half a unit over.
    lowest = min(p["peak_bytes"] for p in [joint.plan] + joint.candidates)
    probe.over = joint.budget_bytes - lowest + UNIT // 2
    rounds = 1 + len(joint.candidates)  # every candidate over: then lowered
    for _ in range(rounds * budget.RUNS_PER_CANDIDATE):
        seeded_step(model, x, ctx)
    probe.over = 0
    # Planned anew for less: the plan in force fits the lowered share.
    assert joint.plan["peak_bytes"] <= joint._units_budget < first_budget - UNIT // 2


def test_where_no_plan_can_be_lowered_enough_the_lowest_measured_is_kept():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.8)
    seeded_step(model, x, ctx)  # the profile
    joint = ctx.joint_budget
    probe.over = 50 * UNIT  # far over, whatever the plan
    with pytest.warns(UserWarning, match="keeping the one measured lowest"):
        while joint.measuring:
            assert_identical(reference, seeded_step(model, x, ctx))
    probe.over = 0
    assert not joint.measuring
    lowest = min(joint._all_trials, key=lambda t: (t[1], t[0]))
    assert joint.plan["choice"] == lowest[2]["choice"]


def test_warm_up_runs_each_candidate_and_keeps_one_that_fits():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, outside=0)
    joint = ctx.joint_budget
    for _ in range(budget.WARMUP_ITERATIONS + 2):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert len(joint.trials) >= 2  # the joint plan and at least one other
    assert not joint.measuring
    fitting = [t for t in joint.trials if t[1] <= joint.budget_bytes]
    assert joint.plan["choice"] == min(fitting, key=lambda t: t[0])[2]["choice"]


def test_the_kept_plan_is_checked_and_lowered_when_a_later_peak_is_over():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8, outside=0)
    joint = ctx.joint_budget
    seeded_step(model, x, ctx)  # the profile
    while not joint._settled:
        seeded_step(model, x, ctx)
    kept_budget = joint._units_budget
    probe.over = 2 * UNIT  # a later step is over
    seeded_step(model, x, ctx)
    probe.over = 0
    assert joint._units_budget < kept_budget
    assert not joint._settled and joint.measuring  # warming up again


def test_the_warm_up_ending_mid_race_keeps_the_best_plan_measured():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8, outside=0)
    joint = ctx.joint_budget
    seeded_step(model, x, ctx)  # the profile
    while len(joint._all_trials) < 2:
        seeded_step(model, x, ctx)
    # The warm-up ends (its iterations spent) while a candidate is running.
    joint.iteration = budget.WARMUP_ITERATIONS + 1
    seeded_step(model, x, ctx)
    fits = [t for t in joint._all_trials if t[1] <= joint.budget_bytes]
    assert joint._settled and fits
    assert joint.plan["choice"] == min(fits, key=lambda t: t[0])[2]["choice"]


def test_an_exception_in_the_profile_forward_then_steps_as_usual():
    # SPEC §7.2: the raised forward is abandoned; the next one is the profile.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5)
    original = model.layers[2].forward
    model.layers[2].forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad batch"))
    with pytest.raises(RuntimeError, match="bad batch"):
        seeded_step(model, x, ctx)
    model.layers[2].forward = original
    for _ in range(6):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.joint_budget.plan is not None
    assert set(ctx.joint_budget.plan["choice"]) != {"keep"}


def test_retain_graph_and_a_frozen_first_layer_under_a_mixed_plan():
    # SPEC §7.1, §7.3: a planned step (offload and recompute) traversed twice,
    # and the first layer frozen; bit-identical to the same loop without it.
    def loop(ctx):
        model = Decoder()
        for p in model.layers[0].parameters():
            p.requires_grad_(False)
        x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1))
        results = []
        for _ in range(8):
            for p in model.parameters():
                p.grad = None
            torch.manual_seed(7)
            if ctx is None:
                out = model(x)
            else:
                with ctx(model):
                    out = model(x)
            loss = (out.float() ** 2).mean()
            loss.backward(retain_graph=True)
            loss.backward()
            results.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        return results

    torch.manual_seed(3)
    reference = loop(None)
    made = {}

    def ctx(model):
        if "ctx" not in made:
            made["ctx"] = make(model, 0.5)[0]
        return made["ctx"]
    torch.manual_seed(3)
    got = loop(ctx)
    for a, b in zip(reference, got):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    choice = made["ctx"].joint_budget.plan["choice"]
    assert "offload" in choice or "recompute" in choice, choice


def test_the_schedule_moves_units_where_the_plans_model_does():
    # Five 100-byte units and a 100-byte head, budget 400: the model releases
    # unit 0 for unit 4 and unit 1 for the head; in the backward, units 2..4
    # and the head hold 400, 300, 200 bytes as the head, unit 4 and unit 3
    # run, so unit 1 comes back beside unit 4's backward and unit 0 beside
    # unit 3's.
    units = [{"saved_bytes": 100, "forward_ns": 100.0, "backward_ns": 200.0,
              "recomputable": False, "input_bytes": 0, "recompute_ns": 0.0,
              "recompute_bytes": 0} for _ in range(5)]
    units[-1]["offloadable"] = False
    units.append({"saved_bytes": 100, "forward_ns": 100.0, "backward_ns": 0.0,
                  "recomputable": False, "offloadable": False})
    plan = actoffload._common.ext().plan_joint(units, 1.0, 1.0, 400, True, False)
    assert plan["choice"][:2] == ["offload", "offload"]
    assert plan["released_during"][:2] == [4, 5]
    assert plan["reloaded_during"][:2] == [3, 4]
    # The engine's steps: unit 0 released as unit 4 begins, unit 1 as well
    # (the head has no step of its own); reloads as the backward of unit 4
    # (the first) and unit 3 (the second) begin.
    assert budget.schedule_for(plan, [0, 1, 2, 3, 4]) == {0: (True, 5, False, 2),
                                                          1: (True, 5, False, 1)}
    # Glue (the plan's unit 1, between units 0 and 1) has no step either: a
    # release during it comes as unit 1 begins, a reload during it as unit
    # 0's backward begins.
    glued = {"choice": ["offload", "keep", "offload", "keep", "keep", "keep"],
             "released_during": [1, -1, 5, -1, -1, -1],
             "reloaded_during": [1, -1, 5, -1, -1, -1]}
    assert budget.schedule_for(glued, [0, 2, 3, 4]) == {0: (True, 2, False, 4),
                                                        1: (True, 4, False, 1)}


def test_budget_fraction_needs_a_probe_and_a_valid_fraction():
    model = Decoder()
    with pytest.raises(ValueError, match="probe"):
        actoffload.OffloadActivations(model, budget_fraction=0.5, backend="sim")
    with pytest.raises(ValueError, match="budget_fraction"):
        actoffload.OffloadActivations(model, budget_fraction=1.5, backend="sim")


def test_a_slower_measured_step_fits_the_copy_bandwidth_and_plans_again():
    # The first plan that offloads measures what the model predicts with a
    # quarter of the bandwidth: the bandwidth is fitted so that the model
    # predicts what was measured, and the joint plan is made again with it.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, _ = make(model, 0.6)
    seeded_step(model, x, ctx)  # the profile
    joint = ctx.joint_budget
    units = joint.profile["units"]
    offloading = _common.ext().plan_joint(units, *joint.bandwidths, joint._units_budget,
                                          True, False)
    assert offloading["offloaded_bytes"] > 0
    before = joint.bandwidths
    recompute = [c == "recompute" for c in offloading["choice"]]
    slow = _common.ext().evaluate_joint(units, before[0] / 4, before[1] / 4,
                                        joint._units_budget, recompute, True)
    assert slow["step_ns"] > offloading["step_ns"]
    measured = slow["step_ns"]  # no trial without copies yet: nothing outside
    joint._calibrate(measured, offloading)
    assert joint._calibrated
    assert joint.bandwidths[0] < before[0] and joint.bandwidths[1] < before[1]
    again = _common.ext().evaluate_joint(units, *joint.bandwidths, joint._units_budget,
                                         recompute, True)
    assert abs(again["step_ns"] - measured) <= 0.01 * measured
    assert joint.predicted_step(offloading) == again["step_ns"]  # what the bench prints
    # A step no slower than predicted changes nothing.
    joint._calibrated, after = False, joint.bandwidths
    joint._calibrate(0.0, offloading)
    assert joint.bandwidths == after


def test_a_unit_that_did_not_run_in_the_profile_is_profiled_again():
    # A layer skipped in the first iteration (a conditional layer, a skipped
    # batch's early exit) leaves nothing to plan with: warned, profiled again.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.6)
    class Skip(torch.nn.Module):
        def forward(self, h):
            return (h,)
    skipped, model.layers[3] = model.layers[3], Skip()  # its hooks do not run
    with pytest.warns(UserWarning, match="unit 3 did not run"):
        seeded_step(model, x, ctx)
    model.layers[3] = skipped
    assert ctx.joint_budget.plan is None
    for _ in range(3):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.joint_budget.plan is not None


def test_compiled_units_are_kept_or_offloaded_never_recomputed():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    for layer in model.layers:
        if hasattr(layer, "compile"):  # torch >= 2: dynamo, without inductor
            layer.compile(backend="eager")
        else:  # what compile() leaves on a module, which torch 1.13 ignores
            layer._compiled_call_impl = layer.forward
    ctx, _ = make(model, 0.6)
    for _ in range(6):
        assert_identical(reference, seeded_step(model, x, ctx))
    joint = ctx.joint_budget
    assert not any(u.get("recomputable") for u in joint.profile["units"])
    assert "offload" in joint.unit_choices(joint.plan)
    assert all("recompute" not in t[2]["choice"] for t in joint._all_trials)


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
