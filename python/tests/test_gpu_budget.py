"""The memory budget on a real Hugging Face model on the GPU (SPEC §4.8,
§7.8; skipped without CUDA or transformers): OffloadActivations(model,
budget_fraction=...) keeps the step's peak, as the user measures it
(max_memory_allocated above memory_allocated before the forward), within
the budget + 2% after its warm-up, with loss and every gradient
bit-identical to no offloading (eager attention, deterministic cuBLAS), per
layer and per block; a budget no plan fits is refused once."""

import warnings

import pytest
import torch

import actoffload

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
tf = pytest.importorskip("transformers")


def build(hidden=512, layers=6):
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                            num_hidden_layers=layers, num_attention_heads=hidden // 128,
                            num_key_value_heads=hidden // 128, vocab_size=1000)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").cuda()
    model.config.use_cache = False
    return model.train()


def step(model, ids, ctx=None):
    """(loss, grads, peak above the memory before the forward)."""
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if ctx is None:
        loss = model(input_ids=ids, labels=ids).loss
    else:
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return loss.detach(), [p.grad.clone() for p in model.parameters()], peak


@pytest.mark.parametrize("granularity,fraction", [
    ("layer", 0.6), ("layer", 0.35), ("block", 0.6), ("block", 0.35)])
def test_budget_holds_and_steps_stay_bit_identical(granularity, fraction):
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    step(model, ids)
    loss, grads, peak = step(model, ids)
    ctx = actoffload.OffloadActivations(model, budget_fraction=fraction,
                                        granularity=granularity)
    steps = 0
    while ctx.joint_budget.measuring or steps < 3:  # the warm-up, then steady steps
        steps = steps + 1 if not ctx.joint_budget.measuring else 0
        got_loss, got_grads, got_peak = step(model, ids, ctx)
        assert torch.equal(loss, got_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, got_grads))
    budget = ctx.joint_budget.budget_bytes
    assert budget == int(fraction * ctx.joint_budget.profile["peak"])
    assert got_peak <= budget * 1.02, (got_peak, budget, peak, ctx.budget_plan())
    assert set(ctx.joint_budget.plan["choice"]) != {"keep"}


@pytest.mark.parametrize("granularity", ["layer", "block"])
def test_budget_holds_on_batches_longer_than_the_warm_ups(granularity):
    # Dynamic padding: the warm-up on 1024 tokens, then batches of 1280 and
    # 1536 run plans made for their length, which the race never measured.
    # Each is checked on its first steps of that length (budget_lengths:
    # the engine's PlanForLengthMeasured): where one is over, the bytes'
    # growth with the length is fitted (eager attention's scores grow as
    # its square) and the plan made with it runs. Before, runs 134-135
    # measured the plan for 1280 at x1.18 of the budget, unwarned; run 139
    # lowered plans by the excess, and at 1536 the peak stayed. After the
    # checks, every step within the budget (+2%), or within the least
    # budget the engine names where none holds that length; every step
    # bit-identical.
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build()
    batches = {n: torch.randint(0, 1000, (2, n), device="cuda",
                                generator=torch.Generator("cuda").manual_seed(n))
               for n in (1024, 1280, 1536)}
    step(model, batches[1024])
    want = {n: step(model, ids)[:2] for n, ids in batches.items()}
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6, granularity=granularity)
    joint = ctx.joint_budget
    while joint.measuring:
        step(model, batches[1024], ctx)
    lengths = [1280] * 6 + [1024] + [1536] * 6 + [1280, 1024]
    peaks = []
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        for n in lengths:
            got_loss, got_grads, got_peak = step(model, batches[n], ctx)
            assert torch.equal(want[n][0], got_loss)
            assert all(torch.equal(a, b) for a, b in zip(want[n][1], got_grads))
            peaks.append((n, got_peak, joint.plan.get("needs_budget", 0),
                          tuple(joint.plan["choice"])))
    budget = joint.budget_bytes
    print(f"budget {budget}, bytes grow as the length to the power "
          f"{joint._race.length_exponent:.3f}", *peaks,
          *sorted({str(w.message) for w in told}), ctx.budget_plan(), sep="\n")
    for at in (3, 4, 5, 10, 11, 12, 13, 14):  # after each length's checks
        # (within the least budget the engine names where none holds that length)
        assert peaks[at][1] <= max(budget, peaks[at][2]) * 1.02, (at, peaks[at], budget)


def test_a_budget_too_small_is_refused_once():
    # Refused once, at the forward after the profile iterations (two where
    # the torch version has selective checkpoint), naming the smallest that
    # fits; then planned for it. Where the model's smallest does not fit as
    # measured (this small model: 243 MB named, 306 MB measured on an H100,
    # 2026-11-26), the budget becomes the lowest measured peak (JointRace).
    model = build()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda")
    ctx = actoffload.OffloadActivations(model, budget_bytes=1 << 20)
    refusals = []
    for _ in range(4):
        try:
            step(model, ids, ctx)
        except ValueError as refused:
            refusals.append(str(refused))
    assert len(refusals) == 1 and "smallest that fits is" in refusals[0], refusals
    while ctx.joint_budget.measuring:
        step(model, ids, ctx)
    _, _, peak = step(model, ids, ctx)
    assert peak <= ctx.joint_budget.budget_bytes * 1.02, ctx.budget_plan()


def _bf16_eager_reference():
    """(model, ids, loss, grads): a 4-layer bf16 eager Llama, deterministic,
    and its step without offloading (after one warm-up step)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build(hidden=1024, layers=4).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 2048), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    step(model, ids)
    loss, grads, _ = step(model, ids)
    return model, ids, loss, grads


@pytest.mark.skipif(not actoffload.recompute.selective_available(),
                    reason="needs torch >= 2.4 (selective checkpoint)")
def test_eager_attention_layers_run_selectively_bit_identical_and_save_less():
    # The second profile iteration runs every layer selectively: eager
    # attention's scores and softmax are re-run, not saved, so each layer
    # saves under a third of what it saves whole; every step, that one and the race's,
    # bit-identical to no offloading. (Whether the plan then takes the
    # choice is the planner's: re-running eager attention's scores and
    # softmax costs about what a whole re-run does, H200 run 49.)
    # In bf16, as trained: the softmax is float32, its copy for the next
    # matmul bf16; selectively, neither is kept, nor the bf16 scores.
    model, ids, loss, grads = _bf16_eager_reference()
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.5)
    steps = 0
    while ctx.joint_budget.measuring or steps < 3:
        steps = steps + 1 if not ctx.joint_budget.measuring else 0
        got_loss, got_grads, got_peak = step(model, ids, ctx)
        assert torch.equal(loss, got_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, got_grads))
    joint = ctx.joint_budget
    units = [joint.profile["units"][place] for place in joint._index]
    assert all(u["selective_bytes"] < 0.3 * u["saved_bytes"] for u in units), units
    assert got_peak <= joint.budget_bytes * 1.02, (got_peak, joint.budget_bytes)


@pytest.mark.skipif(not actoffload.recompute.selective_available(),
                    reason="needs torch >= 2.4 (selective checkpoint)")
def test_selective_offload_units_hold_less_and_stay_bit_identical():
    # Layers 0..2 selective, then selective-offload (their saved matmul
    # outputs to host and back through the engine, their inputs kept for
    # the re-run): every step bit-identical to no offloading, and the
    # step's peak lower by at least half of what they send to host.
    from budget_testing import forced_plan
    model, ids, loss, grads = _bf16_eager_reference()
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.9)
    joint = ctx.joint_budget
    while joint.measuring:
        step(model, ids, ctx)
    peaks = {}
    for choice in ("selective", "selective-offload"):
        joint._apply(forced_plan(joint, {0: choice, 1: choice, 2: choice, 3: "keep"}))
        for _ in range(3):
            got_loss, got_grads, peaks[choice] = step(model, ids, ctx)
            assert torch.equal(loss, got_loss), choice
            assert all(torch.equal(a, b) for a, b in zip(grads, got_grads)), choice
    units = [joint.profile["units"][joint._index[i]] for i in range(3)]
    sent = sum(u["selective_bytes"] - u["input_bytes"] for u in units)
    assert peaks["selective-offload"] <= peaks["selective"] - sent // 2, (peaks, sent)


@pytest.mark.skipif(not hasattr(torch.nn.Module, "compile"), reason="needs torch >= 2.2")
@pytest.mark.parametrize("attention,allow_offload,fraction", [
    ("eager", True, 0.7), ("eager", False, 0.5), ("eager", True, 0.45), ("sdpa", True, 0.6)])
def test_budget_holds_with_each_decoder_layer_compiled(attention, allow_offload, fraction):
    # Issue 30: "eager and with each decoder block compiled". A compiled
    # layer is kept, offloaded or recomputed whole, the checkpoint around
    # its compiled call (recompute.compiled): the peak holds
    # after the warm-up, and loss and gradients equal the same compiled
    # model's without offloading (bit for bit with eager attention; SDPA's
    # memory-efficient backward is not deterministic: within its spread).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=512, intermediate_size=512 * 11 // 4,
                            num_hidden_layers=6, num_attention_heads=4,
                            num_key_value_heads=4, vocab_size=1000)
    model = tf.AutoModelForCausalLM.from_config(
        config, attn_implementation=attention).cuda().train()
    model.config.use_cache = False
    for layer in model.model.layers:
        layer.compile()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    step(model, ids)
    loss, grads, peak = step(model, ids)
    _, again, _ = step(model, ids)
    spread = max((a - b).abs().max().item() for a, b in zip(grads, again))
    ctx = actoffload.OffloadActivations(model, budget_fraction=fraction,
                                        allow_offload=allow_offload)
    steps = 0
    while ctx.joint_budget.measuring or steps < 3:
        steps = steps + 1 if not ctx.joint_budget.measuring else 0
        got_loss, got_grads, got_peak = step(model, ids, ctx)
        assert torch.equal(loss, got_loss)
        diff = max((a - b).abs().max().item() for a, b in zip(grads, got_grads))
        assert diff <= 4 * spread, (diff, spread, ctx.joint_budget.unit_choices(
            ctx.joint_budget.plan))
    joint = ctx.joint_budget
    choices = joint.unit_choices(joint.plan)
    assert "selective" not in choices, choices
    assert set(choices) != {"keep"}, choices
    if not allow_offload:
        assert "recompute" in choices and "offload" not in choices, choices
    assert got_peak <= joint.budget_bytes * 1.02, (got_peak, joint.budget_bytes, peak,
                                                   ctx.budget_plan())
    assert got_peak < 0.9 * peak, (got_peak, peak)
