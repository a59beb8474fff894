"""Issue 30, session 13: every front door on Hugging Face models nobody here wrote.

For each architecture transformers can build from a config (small: hidden
HIDDEN, LAYERS layers, SEQ tokens, eager attention, bf16, its default
dropout on, deterministic algorithms), in one process:
  - no offloading, twice (the reference and its repeat);
  - torchtune's usage (OffloadActivations() around the forward) and its recipe
    helper (get_act_offloading_ctx_manager);
  - TE's door over all but the last layer (get_cpu_offload_context, each
    layer's forward inside the context, its output through sync);
  - the budget (OffloadActivations(model, budget_fraction=f)) per layer and
    per block at each fraction, through its warm-up.
Each door's steps are compared with the reference bit for bit (loss and every
gradient; the RNG is seeded the same before each step), and the budget's
steady steps' peak (max_memory_allocated above the memory before the forward,
gradients freed before the step) with its budget + 2%. One line per door:
ok, or what went wrong (the exception, a difference, a peak over).

With --sdpa, attention is PyTorch's SDPA, whose backward is not
deterministic: the loss must be identical and each gradient within four
times the repeat's own largest difference (at least 1e-3 of its largest
value).

    PYTHONPATH=python python models_sweep.py [--sdpa] [--compile] [NAMES...]
"""
import contextlib
import sys
import traceback
import warnings

import torch
import transformers as tf

import actoffload
from actoffload import demo

HIDDEN, LAYERS, SEQ, VOCAB = 1024, 4, 2048, 4096
FRACTIONS = (0.6, 0.35)
ATTN = "sdpa" if "--sdpa" in sys.argv else "eager"
# --compile: each decoder layer compiled (layer.compile()), and only the
# budget per layer (the other doors, recompiled for their hooks, are slow).
COMPILE = "--compile" in sys.argv
TOLERANCE = []  # --sdpa: per gradient, what the repeat's differences allow
# config class, model class (None: AutoModelForCausalLM), extra settings
ARCHS = [
    ("LlamaConfig", None, {}),
    ("MistralConfig", None, {"num_key_value_heads": 2, "sliding_window": 1024}),
    ("Qwen2Config", None, {"num_key_value_heads": 2}),
    ("Qwen3Config", None, {}),
    ("GemmaConfig", None, {}),
    ("Gemma2Config", None, {}),
    ("Gemma3TextConfig", None, {}),
    ("Phi3Config", None, {}),
    ("PhiConfig", None, {}),
    ("GPTNeoXConfig", None, {}),
    ("OPTConfig", None, {"ffn_dim": 4096, "word_embed_proj_dim": 1024}),
    ("FalconConfig", None, {}),
    ("BloomConfig", None, {}),
    ("GPTJConfig", None, {"rotary_dim": 64}),
    ("StableLmConfig", None, {}),
    ("OlmoConfig", None, {}),
    ("Olmo2Config", None, {}),
    ("GraniteConfig", None, {}),
    ("CohereConfig", None, {}),
    ("GPT2Config", None, {}),
    ("GPTBigCodeConfig", None, {}),
    ("MixtralConfig", None, {"num_local_experts": 4, "intermediate_size": 1024}),
    ("Qwen2MoeConfig", None, {"num_experts": 4, "moe_intermediate_size": 512,
                              "shared_expert_intermediate_size": 1024}),
    ("Qwen3MoeConfig", None, {"num_experts": 4, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 512}),
    ("Starcoder2Config", None, {}),
    ("MptConfig", None, {"d_model": 1024, "n_heads": 8, "n_layers": 4}),
    ("CodeGenConfig", None, {"rotary_dim": 64}),
    ("XGLMConfig", None, {"d_model": 1024, "ffn_dim": 2816}),
    ("GlmConfig", None, {}),
    ("SmolLM3Config", None, {}),
    ("BertConfig", "AutoModelForMaskedLM", {}),
    ("T5Config", "AutoModelForSeq2SeqLM", {"decoder_start_token_id": 0, "d_model": 1024, "d_ff": 2816, "num_layers": 4,
                                           "num_decoder_layers": 4, "num_heads": 8, "d_kv": 128}),
    ("BartConfig", "AutoModelForSeq2SeqLM", {"d_model": 1024, "encoder_layers": 4, "decoder_layers": 4,
                                             "encoder_ffn_dim": 2816, "decoder_ffn_dim": 2816,
                                             "encoder_attention_heads": 8,
                                             "decoder_attention_heads": 8}),
]


def build(config_name, model_class, extra):
    config = getattr(tf, config_name)()
    common = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": 8,
              "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": VOCAB,
              "head_dim": HIDDEN // 8, "max_position_embeddings": 4 * SEQ,
              "n_positions": 4 * SEQ, "n_inner": None, "use_cache": False}
    for key, value in {**common, **extra}.items():
        if key in extra or hasattr(config, key):
            try:
                setattr(config, key, value)
            except AttributeError:  # a property (Falcon's head_dim)
                pass
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= VOCAB:
            setattr(config, key, 0)
    torch.manual_seed(0)
    cls = getattr(tf, model_class or "AutoModelForCausalLM")
    model = cls.from_config(config, attn_implementation=ATTN)
    return model.to(device="cuda", dtype=torch.bfloat16).train()


def step(model, ids, wrap):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with wrap():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return loss.detach(), grads, peak


def differs(ref, got):
    if not torch.equal(ref[0], got[0]):
        return f"loss {ref[0].item():.6f} vs {got[0].item():.6f}"
    for i, (a, b) in enumerate(zip(ref[1], got[1])):
        if TOLERANCE and a is not None and b is not None and (
                (a.float() - b.float()).abs().max() <= TOLERANCE[i]):
            continue
        if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
            d = "None" if a is None or b is None else f"{(a.float() - b.float()).abs().max():.3g}"
            return f"gradient {i} differs ({d})"
    return None


def te_wrap(model, n):
    ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=n - 1, model_layers=n)
    return lambda: demo.te_hooks(model, ctx, sync)


def budget_door(model, ids, ref, fraction, granularity):
    budget = int(fraction * ref[2])
    ctx = actoffload.OffloadActivations(model, budget_bytes=budget, granularity=granularity)
    jb, note, steps = ctx.joint_budget, "", 0
    for steps in range(1, 80):
        try:
            got = step(model, ids, lambda: ctx)
        except ValueError as refused:
            note = f" refused ({str(refused)[:80]}...)"
            continue
        bad = differs(ref, got)
        if bad:
            return f"step {steps}: {bad}"
        if jb is not None and not jb.measuring:
            break
    peaks = [step(model, ids, lambda: ctx)[2] for _ in range(2)]
    limit = jb.budget_bytes if note else budget
    plan = "".join({"keep": "K", "offload": "O", "recompute": "R", "selective": "S",
                    "selective-offload": "Q"}[c] for c in jb.unit_choices(jb.plan))
    over = max(peaks) > limit * 1.02
    return (("PEAK OVER " if over else "ok ") + f"{plan} peak {max(peaks) / ref[2]:.3f} "
            f"budget {limit / ref[2]:.3f} after {steps} steps{note}"
            + (f"\n{ctx.budget_plan()}" if over else ""))


def run(arch):
    try:
        doors(arch)
    except Exception as e:  # noqa: BLE001
        print(f"{arch[0]:18s} {type(e).__name__}: {str(e)[:300]}", flush=True)
        traceback.print_exc(limit=-4)
    torch.cuda.empty_cache()


def doors(arch):
    name, model_class, extra = arch
    try:
        model = build(name, model_class, extra)
    except Exception as e:  # noqa: BLE001 - an architecture this transformers lacks
        print(f"{name:18s} build: {type(e).__name__}: {str(e)[:100]}", flush=True)
        return
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(0)).cuda()
    try:
        layers = actoffload.find_layers(model)
        units = [type(u).__name__ for u in
                 actoffload.budget.find_units(layers, "block")[:3]]
    except Exception as e:  # noqa: BLE001
        layers, units = [], [f"find_layers: {e}"]
    print(f"{name:18s} {type(model).__name__}, {len(layers)} layers "
          f"({type(layers[0]).__name__ if layers else '-'}), first blocks {units}", flush=True)
    step(model, ids, contextlib.nullcontext)
    if COMPILE:
        for layer in layers:
            layer.compile()
        step(model, ids, contextlib.nullcontext)
    ref = step(model, ids, contextlib.nullcontext)
    TOLERANCE.clear()
    if ATTN == "sdpa":
        again = step(model, ids, contextlib.nullcontext)
        TOLERANCE.extend(0.0 if a is None or b is None else
                         max(4 * (a.float() - b.float()).abs().max().item(),
                             1e-3 * a.float().abs().max().item())
                         for a, b in zip(ref[1], again[1]))
    doors = [("again", lambda: contextlib.nullcontext),
             ("torchtune", lambda: actoffload.OffloadActivations),
             ("tt-recipe", lambda: (lambda: actoffload.get_act_offloading_ctx_manager(model, True))),
             ("te", lambda: te_wrap(model, len(layers)))]
    for door, make in doors if not COMPILE else doors[:1]:
        try:
            wrap = make()
            for i in range(3):
                bad = differs(ref, step(model, ids, wrap))
                if bad:
                    break
            print(f"  {door:14s} {'ok' if not bad else bad}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {door:14s} {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc(limit=-3)
    for fraction in FRACTIONS:
        for granularity in ("layer", "block") if not COMPILE else ("layer",):
            door = f"budget {granularity} {fraction}"
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    result = budget_door(model, ids, ref, fraction, granularity)
                print(f"  {door:14s} {result}", flush=True)
                if not result.startswith("ok"):
                    for message in sorted({str(w.message)[:300] for w in caught}):
                        print(f"    warned: {message}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {door:14s} {type(e).__name__}: {str(e)[:300]}", flush=True)
                traceback.print_exc(limit=-4)


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True, warn_only=True)
    wanted = set(sys.argv[1:]) - {"--sdpa", "--compile"}
    for arch in ARCHS:
        if not wanted or arch[0] in wanted:
            run(arch)
