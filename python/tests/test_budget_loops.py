"""The memory budget (budget.py) under SPEC §7's training-loop patterns, on
the CPU and the simulated GPU with a scripted probe: an exception in the
profile forward, retain_graph with a frozen layer, a skipped unit, an
outer checkpoint around the units (Hugging Face's gradient checkpointing;
compiled units too), the lean steady state
(a settled plan that offloads nothing) under those patterns, and the
engine's saved-tensor hooks in force only inside the units a plan
offloads; several forwards per step, each in its own context (gradient
accumulation, two views in one backward, three forwards measured for the
plan they ran). Units never re-run, or re-run without a cache:
test_budget_reruns.py. Batches of varying length: test_budget_lengths.py."""

import contextlib
import warnings

import pytest
import torch

import actoffload
from actoffload import _common, budget
from budget_testing import CheckpointedDecoder, Decoder, compile_layers, make, seeded_step
from models import assert_identical


@pytest.mark.skipif(not hasattr(torch._C, "_current_graph_task_id"),
                    reason="torch < 2: no way to tell a re-run in the backward")
@pytest.mark.parametrize("compiled", [False, True])
def test_units_under_an_outer_checkpoint_rerun_as_their_forward_ran(compiled):
    # Hugging Face's gradient checkpointing wraps each layer's call in a
    # non-reentrant checkpoint; its re-run in the backward (after the
    # context's exit) must save what the forward saved, or it refuses it.
    # So must a compiled layer's (its wrapper is its compiled call's).
    model = CheckpointedDecoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    if compiled:
        compile_layers(model)
        if torch.cuda.is_available():
            # Dynamo's first compilation, inside the outer checkpoint's
            # forward, initializes CUDA, which that checkpoint refuses
            # (RuntimeError, without the package too) if it was not already.
            torch.cuda.init()
    ctx, _ = make(model, 0.6, allow_offload=False)
    for _ in range(8):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert "recompute" in ctx.joint_budget.unit_choices(ctx.joint_budget.plan)


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


@pytest.mark.parametrize("compiled", [False, True])
def test_retain_graph_and_a_frozen_first_layer_under_a_mixed_plan(compiled):
    # SPEC §7.1, §7.3: a planned step (offload and recompute) traversed twice,
    # and the first layer frozen; bit-identical to the same loop without it.
    # Compiled units are re-run through their compiled call.
    def loop(ctx):
        model = Decoder()
        if compiled:
            compile_layers(model)
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


def _grads_of(model, ctx, *inputs):
    """One step: the model on each input (all inside one `with ctx` when
    given), the loss of their outputs' differences, and the gradients
    (None for a parameter the step did not use)."""
    torch.manual_seed(7)
    for p in model.parameters():
        p.grad = None
    with ctx if ctx is not None else contextlib.nullcontext():
        outs = [model(x) for x in inputs]
    loss = sum(((out - 0.5 * i) ** 2).mean() for i, out in enumerate(outs))
    (loss + (outs[0] - outs[-1]).pow(2).mean()).backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _same(a, b):
    return all((u is None and v is None) or torch.equal(u, v) for u, v in zip(a, b))


class _SkipsALayer(Decoder):
    """Stochastic depth: layer `skip` (if any) does not run this step."""
    skip = None

    def forward(self, x):
        x = self.embed(x)
        for i, layer in enumerate(self.layers):
            if i != self.skip:
                x = layer(x)[0]
        return self.head(x)


def test_a_layer_skipped_after_the_plan_and_two_forwards_in_one_context():
    # Stochastic depth once the plan is settled: the layers after the
    # skipped one run outside offloading that step (a warning says so),
    # and every step stays bit-identical.
    # (The race runs until it settles: on a GPU its trials and rematches
    # can take more than the 12 steps they take here; run 118 failed at 12.)
    model = _SkipsALayer()
    x = torch.randn(2, 32, 64)
    ctx, _ = make(model, 0.6)
    for it in range(budget.WARMUP_ITERATIONS + 8):
        settled = not ctx.joint_budget.measuring
        model.skip = it % 4 if settled else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _same(_grads_of(model, None, x), _grads_of(model, ctx, x)), it
    assert settled and not ctx.joint_budget.measuring
    # Two forwards of the model inside one context (two views of a batch):
    # the second runs its layers again, outside offloading; a budget that
    # then cannot be kept is refused once, and the steps stay bit-identical.
    model = Decoder()
    ctx, _ = make(model, 0.6)
    refused = 0
    for it in range(budget.WARMUP_ITERATIONS + 8):
        reference = _grads_of(model, None, x, x * 0.5)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _grads_of(model, ctx, x, x * 0.5)
        except ValueError as refusal:
            assert "smallest that fits" in str(refusal)
            refused += 1
            continue
        assert _same(reference, got), it
    assert refused <= 1 and not ctx.joint_budget.measuring


class _ReentrantDecoder(CheckpointedDecoder):
    """Each layer inside a reentrant checkpoint (Hugging Face's
    gradient_checkpointing_enable() without use_reentrant=False): the
    layer's forward, hooks included, runs under no_grad."""
    use_reentrant = True


@pytest.mark.parametrize("door", ["layers", "budget"])
def test_layers_inside_a_reentrant_checkpoint_warn_once_and_stay_bit_identical(door):
    # They save nothing for backward: nothing to offload, recompute or
    # measure. One warning says so and how to combine the two; before, each
    # step's engine iteration saw layers begin and no backward, and every
    # step warned that it had been abandoned.
    model = _ReentrantDecoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    if door == "layers":
        ctx = actoffload.OffloadActivations(layers=model.layers, backend="sim",
                                            min_offload_size=1024)
    else:
        ctx, _ = make(model, 0.6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            assert_identical(reference, seeded_step(model, x, ctx))
    messages = [str(w.message) for w in caught if "actoffload" in str(w.message)]
    assert len(messages) == 1 and "use_reentrant=False" in messages[0], messages


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


@pytest.mark.parametrize("compiled", [False, True])
def test_the_lean_steady_state_under_training_loop_patterns(compiled):
    # A settled plan that offloads nothing runs without the engine
    # (JointBudget.lean): retain_graph twice with a frozen first layer, an
    # exception mid-forward, a forward whose backward never runs, and an
    # eval forward without grad, each as without the context. The patterns
    # begin once the race has settled (with the context) and after as many
    # steps without it.
    made = {}

    def ctx(model):
        if "ctx" not in made:
            made["ctx"] = make(model, 0.5, allow_offload=False)[0]
        return made["ctx"]

    def loop(ctx, warm=None):
        model = Decoder()
        if compiled:
            compile_layers(model)
        model.layers[0].requires_grad_(False)
        x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1))
        results, lean = [], []

        def forward():
            torch.manual_seed(7)
            if ctx is None:
                return model(x)
            with ctx(model) as entered:
                lean.append(entered._lean)
                return model(x)

        step = 0
        while step < 60 and (step < warm if warm is not None else
                             step == 0 or made["ctx"].joint_budget.measuring):
            step += 1
            for p in model.parameters():
                p.grad = None
            loss = (forward().float() ** 2).mean()
            loss.backward(retain_graph=True)
            loss.backward()
            results.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        settled = step
        for pattern in range(4):
            for p in model.parameters():
                p.grad = None
            if pattern == 0:  # an exception mid-forward, caught by the loop
                original = model.layers[2].forward
                model.layers[2].forward = lambda *a, **k: (_ for _ in ()).throw(
                    RuntimeError("bad batch"))
                with pytest.raises(RuntimeError, match="bad batch"):
                    forward()
                model.layers[2].forward = original
            if pattern == 1:
                forward()  # its backward never runs (a skipped batch)
            if pattern == 2:
                with torch.no_grad():
                    results.append([model(x)])
            loss = (forward().float() ** 2).mean()
            loss.backward(retain_graph=True)
            loss.backward()
            results.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        return results, lean, settled

    torch.manual_seed(3)
    got, lean, settled = loop(ctx)
    torch.manual_seed(3)
    reference, _, _ = loop(None, warm=settled)
    assert len(reference) == len(got)
    for a, b in zip(reference, got):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    joint = made["ctx"].joint_budget
    assert "recompute" in joint.plan["choice"] and not joint.measuring
    # Every forward of the patterns (the exception's, the skipped batch's,
    # the rest) ran lean.
    assert len(lean) == settled + 6 and all(lean[settled:]), (settled, lean)


needs_hook_stack = pytest.mark.skipif(
    _common.saved_hooks_top() is NotImplemented,
    reason="torch < 2.8 cannot say which saved-tensor hooks are in force: the "
           "engine's hooks are in force for the whole forward there")


def _watch_hooks(ctx, model):
    """Per unit (and the head): whether the engine's saved-tensor hooks were
    the innermost in force as its forward began, in the latest forward."""
    seen = {}

    def watcher(key):
        def hook(module, args):
            if torch.is_grad_enabled() and not _common.in_backward():
                top = _common.saved_hooks_top()
                seen[key] = top is not None and top[0] == ctx.offloader.pack
        return hook
    for index, layer in enumerate(model.layers):
        layer.self_attn.register_forward_pre_hook(watcher(index))
    model.head.register_forward_pre_hook(watcher("head"))
    return seen


@needs_hook_stack
def test_the_engines_hooks_are_in_force_only_inside_the_offloaded_units():
    # Elsewhere autograd saves as without the context, at no cost per tensor.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, allow_recompute=False)  # a plan that offloads
    seen = _watch_hooks(ctx, model)
    settled = 0
    for _ in range(60):  # the warm-up, then two steps of the settled plan
        assert_identical(reference, seeded_step(model, x, ctx))
        assert _common.saved_hooks_top() is None
        settled = settled + 1 if not ctx.joint_budget.measuring else 0
        if settled == 3:
            break
    choices = ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert "offload" in choices, choices
    assert seen == dict({i: c == "offload" for i, c in enumerate(choices)}, head=False)
    assert ctx.offloader.stats()["bytes_offloaded"] > 0


def _settled(model, x, **kwargs):
    """A budget of 0.5 for `model` (make's `kwargs`) whose warm-up is over."""
    ctx, _ = make(model, 0.5, **kwargs)
    for _ in range(60):
        seeded_step(model, x, ctx)
        if not ctx.joint_budget.measuring:
            break
    return ctx


def _raise_in(module):
    """Makes `module`'s next calls raise, as a bad batch does (del its
    forward to end it)."""
    module.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad batch"))


@needs_hook_stack
def test_an_exception_inside_an_offloaded_unit_leaves_no_hooks_in_force():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx = _settled(model, x, allow_recompute=False)
    choices = ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert choices[0] == "offload", choices
    _raise_in(model.layers[0].self_attn)
    with pytest.raises(RuntimeError, match="bad batch"):
        seeded_step(model, x, ctx)
    del model.layers[0].self_attn.forward
    assert _common.saved_hooks_top() is None
    for _ in range(3):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.offloader.stats()["bytes_offloaded"] > 0


@needs_hook_stack
@pytest.mark.parametrize("compiled", [False, True])
def test_an_exception_inside_a_recomputed_unit_leaves_no_hooks_in_force(compiled):
    # PyTorch's checkpoint leaves its hooks pushed where its function raises
    # until the traceback is collected; the context's exit ends it, so that
    # a caller who keeps the exception steps as usual (a compiled unit's
    # checkpoint too, around its compiled call).
    model = Decoder()
    if compiled:
        compile_layers(model)
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx = _settled(model, x, allow_offload=False)
    choices = ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert choices[0] == "recompute", choices
    _raise_in(model.layers[0].mlp)
    with pytest.raises(RuntimeError, match="bad batch") as raised:
        seeded_step(model, x, ctx)
    del model.layers[0].mlp.forward
    assert _common.saved_hooks_top() is None
    for _ in range(3):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert str(raised.value) == "bad batch"  # still held


@needs_hook_stack
def test_under_an_outer_checkpoint_its_hooks_win_over_the_engines():
    # Hugging Face's gradient checkpointing around each layer: its hooks are
    # pushed before the layer's forward begins; the engine's stay out.
    model = CheckpointedDecoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, allow_recompute=False)
    seen = _watch_hooks(ctx, model)
    for _ in range(8):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert "offload" in ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert not any(seen.values()), seen


def _accumulated(model, ctx, batches, together):
    """One optimizer step's gradients: each of `batches` through the model,
    inside its own `with ctx` when given; with `together`, one backward of
    their summed losses (a contrastive loss over two views), else one
    backward each, accumulating into .grad (gradient accumulation)."""
    torch.manual_seed(7)
    for p in model.parameters():
        p.grad = None
    losses = []
    for x in batches:
        with ctx if ctx is not None else contextlib.nullcontext():
            out = model(x)
        loss = (out ** 2).mean() / len(batches)
        if together:
            losses.append(loss)
        else:
            loss.backward()
    if together:
        sum(losses).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("together", [False, True], ids=["accumulated", "one_backward"])
def test_several_forwards_per_step_each_in_its_own_context(together):
    # Gradient accumulation (four micro-batches, a backward each) and two
    # views whose losses meet in one backward (SPEC §7.4), each forward
    # entering the context on its own, from the profile through the race
    # to the steady state: every step bit-identical, the race settled.
    model = Decoder()
    batches = [torch.randn(2, 32, 64) for _ in range(4 if not together else 2)]
    ctx, _ = make(model, 0.6)
    steps = 0
    while ctx.joint_budget.measuring or steps < 3:
        steps = steps + 1 if not ctx.joint_budget.measuring else 0
        reference = _accumulated(model, None, batches, together)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _accumulated(model, ctx, batches, together)
        assert _same(reference, got)
    assert ctx.joint_budget._settled
    assert set(ctx.joint_budget.unit_choices(ctx.joint_budget.plan)) != {"keep"}


class _MeasuredSpy:
    """The budget's race (_C.JointRace), each measured() call checked: the
    race's plan then must be the one the step's forwards ran (`ran`)."""

    def __init__(self, race):
        self.__dict__.update(race=race, ran=None, calls=0)

    def __getattr__(self, name):
        return getattr(self.race, name)

    def __setattr__(self, name, value):
        setattr(self.race, name, value)

    def measured(self, step_ns, peak):
        assert self.race.plan["choice"] == self.ran, "measured for a plan that did not run"
        self.__dict__["calls"] += 1
        return self.race.measured(step_ns, peak)


def test_three_forwards_before_one_backward_are_measured_for_the_plan_they_ran():
    # Each forward enters the context on its own; the first one's pass end
    # may move the race to its next plan, and the other two, which ran the
    # plan before, are not measured for the new one.
    model = Decoder()
    batches = [torch.randn(2, 32, 64) for _ in range(3)]
    ctx, _ = make(model, 0.6)
    joint = ctx.joint_budget
    while joint.plan is None:
        _accumulated(model, ctx, batches[:1], True)
    joint._race = spy = _MeasuredSpy(joint._race)
    reference = _accumulated(model, None, batches, True)
    for _ in range(budget.WARMUP_ITERATIONS):
        torch.manual_seed(7)
        for p in model.parameters():
            p.grad = None
        outs = []
        for x in batches:
            with ctx:
                outs.append(model(x))
        spy.__dict__["ran"] = joint.plan["choice"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sum((out ** 2).mean() / 3 for out in outs).backward()
        assert _same(reference, [p.grad for p in model.parameters()])
        if joint._settled and not joint.measuring:
            break
    assert joint._settled and spy.calls >= 3
