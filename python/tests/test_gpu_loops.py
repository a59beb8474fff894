"""Real training-loop patterns on a Hugging Face Llama on the GPU (skipped
without CUDA or transformers): LoRA adapters (peft), non-reentrant gradient
checkpointing, bf16 autocast and a gradient penalty through
autograd.grad(create_graph=True), each through TE's front door,
OffloadActivations(layers=model, model=model), torchtune's
get_act_offloading_ctx_manager and the memory budget
(OffloadActivations(model, budget_fraction=0.5): its profile, every plan its
warm-up races and the one it keeps); loss and every gradient bit-identical to the
loop without the package on every step (eager attention, deterministic
cuBLAS), and nothing left live after the step."""

import contextlib
import os
import warnings

import pytest
import torch

import actoffload
from actoffload.demo import te_hooks  # what a TE user does with a HF model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
tf = pytest.importorskip("transformers")


def build(lora, ckpt):
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").cuda()
    model.config.use_cache = False
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def step(model, ids, wrap, amp, penalty):
    for p in model.parameters():
        p.grad = None
    autocast = torch.autocast("cuda", torch.bfloat16) if amp else contextlib.nullcontext()
    with autocast:
        with wrap():
            loss = model(input_ids=ids, labels=ids).loss
        if penalty:
            last = [p for p in model.parameters() if p.requires_grad][-1]
            grad, = torch.autograd.grad(loss, last, create_graph=True)
            loss = loss + 1e-3 * grad.pow(2).sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def reproducible(lora, ckpt, amp, penalty):
    """(model, input ids, the step without the package): deterministic
    cuBLAS, no TF32, so that every door's step must equal it bit for bit."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(lora, ckpt)
    ids = torch.randint(0, 1000, (2, 512), device="cuda")
    return model, ids, step(model, ids, contextlib.nullcontext, amp, penalty)


@pytest.mark.parametrize("penalty", [False, True], ids=["plain", "penalty"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("lora,ckpt", [(False, False), (True, False), (True, True)],
                         ids=["full", "lora", "lora_checkpointing"])
def test_hugging_face_llama_loops_are_bit_identical(lora, ckpt, amp, penalty):
    model, ids, reference = reproducible(lora, ckpt, amp, penalty)
    n = len(actoffload.find_layers(model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchtune's helper: no `output` head
        ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=2, model_layers=n)
        doors = {"te": (lambda: te_hooks(model, ctx, sync), ctx),
                 "oa": (None, actoffload.OffloadActivations(layers=model, model=model)),
                 "tune": (None, actoffload.get_act_offloading_ctx_manager(model, True)),
                 # The memory budget: its profile, warm-up race (offload,
                 # recompute and mixed plans) and steady steps.
                 "budget": (None, actoffload.OffloadActivations(model, budget_fraction=0.5))}
        for name, (wrap, door) in doors.items():
            wrap = wrap or (lambda door=door: door)
            joint = getattr(door, "joint_budget", None)
            steps, refused = 0, False
            while steps < 2 or (joint is not None and steps < 40 and (
                    joint.measuring or joint.refusal is not None)):
                steps += 1
                try:
                    loss, grads = step(model, ids, wrap, amp, penalty)
                except ValueError as refusal:
                    # SPEC §7.8: a budget no plan fits (HF's own checkpointing
                    # leaves little to plan) is refused once, at the next
                    # forward's enter, and the smallest that fits is planned.
                    assert joint is not None and not refused, refusal
                    assert "smallest that fits" in str(refusal)
                    refused = True
                    continue
                assert torch.equal(loss, reference[0]), (name, steps)
                assert len(grads) == len(reference[1])
                assert all(torch.equal(a, b) for a, b in zip(grads, reference[1])), (name, steps)
            assert door.offloader.live_iterations() == 0, name
            if joint is not None:
                assert not joint.measuring, joint.describe()
                if not ckpt:  # with HF's checkpointing, keeping all can be the least
                    assert {c for t in joint._all_trials for c in t[2]["choice"]} > {"keep"}
    assert ctx.offloader.stats()["bytes_offloaded"] > 0


@pytest.mark.parametrize("penalty", [False, True], ids=["plain", "penalty"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("lora,ckpt", [(False, False), (True, False), (True, True)],
                         ids=["full", "lora", "lora_checkpointing"])
def test_every_choice_of_the_budget_in_hugging_face_loops_is_bit_identical(
        lora, ckpt, amp, penalty):
    # Once the budget's warm-up is over, a plan with each of its five choices
    # (budget_testing.forced_plan): selective-offload, selective, offload,
    # recompute and keep, one per layer, bit-identical on every step with
    # LoRA, Hugging Face's own checkpointing, autocast and a gradient penalty.
    from actoffload import recompute
    if not recompute.selective_available():
        pytest.skip("needs torch >= 2.4 (selective checkpoint)")
    from budget_testing import forced_plan
    model, ids, reference = reproducible(lora, ckpt, amp, penalty)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.9)
    budget = ctx.joint_budget
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a budget the small model cannot meet
        for _ in range(60):
            try:
                step(model, ids, lambda: ctx, amp, penalty)
            except ValueError as refusal:
                assert "smallest that fits" in str(refusal)
            if not budget.measuring and budget.refusal is None:  # none pending
                break
    assert not budget.measuring
    choices = ["selective-offload", "selective", "offload", "recompute"]
    budget._apply(forced_plan(budget, dict(enumerate(choices))))
    assert budget.unit_choices(budget.plan) == choices
    before = ctx.offloader.stats()["bytes_offloaded"]
    for _ in range(2):
        loss, grads = step(model, ids, lambda: ctx, amp, penalty)
        assert torch.equal(loss, reference[0])
        assert len(grads) == len(reference[1])
        assert all(torch.equal(a, b) for a, b in zip(grads, reference[1]))
    assert ctx.offloader.live_iterations() == 0
    assert (ctx.offloader.stats()["bytes_offloaded"] > before) == (not ckpt)


def test_skipped_batches_and_eval_passes_during_the_budgets_warm_up():
    # A loop that skips a batch (its loss computed, its graph dropped, no
    # backward) every third iteration and runs an eval pass with grad on
    # every fifth, from the first iteration on, through the profile and the
    # warm-up race: every real step bit-identical, the race settles, and
    # the kept plan's steps hold the budget (+2%) as the user measures it.
    model, ids, reference = reproducible(False, False, False, False)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
    budget = ctx.joint_budget
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for it in range(80):
            if it % 3 == 2:
                with ctx:
                    loss = model(input_ids=ids, labels=ids).loss
                del loss  # a skipped batch
                continue
            if it % 5 == 4:
                model.eval()
                with ctx:
                    model(input_ids=ids, labels=ids)
                model.train()
                continue
            loss, grads = step(model, ids, lambda: ctx, False, False)
            assert torch.equal(loss, reference[0]), it
            assert all(torch.equal(a, b) for a, b in zip(grads, reference[1])), it
            if not budget.measuring and it > 50:
                break
    assert not budget.measuring, budget.describe()
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= budget.budget_bytes * 1.02, (peak, budget.describe())
    assert ctx.offloader.live_iterations() == 0
