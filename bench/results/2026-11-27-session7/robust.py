"""Session 7 probe: models nobody here wrote, default configs (use_cache
left as the config has it), every front door; bit-identity to no offload
(eager attention, deterministic), exceptions printed."""
import contextlib, sys, traceback, warnings
import torch
import transformers as tf
import actoffload

torch.use_deterministic_algorithms(True, warn_only=True)
warnings.simplefilter("ignore")
print("transformers", tf.__version__, "torch", torch.__version__, flush=True)

def configs():
    h, n, heads = 512, 4, 4
    common = dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads,
                  num_key_value_heads=heads // 2, vocab_size=1000, intermediate_size=h * 2)
    yield "llama", lambda: tf.LlamaConfig(**common)
    yield "mistral", lambda: tf.MistralConfig(**common)
    yield "qwen2", lambda: tf.Qwen2Config(**common)
    yield "qwen3", lambda: tf.Qwen3Config(**common, head_dim=128)
    yield "phi3", lambda: tf.Phi3Config(**common)
    yield "gemma2", lambda: tf.Gemma2Config(**common, head_dim=128, pad_token_id=0,
                                             bos_token_id=1, eos_token_id=2)
    yield "qwen2moe", lambda: tf.Qwen2MoeConfig(**common, moe_intermediate_size=256,
        shared_expert_intermediate_size=512, num_experts=12, num_experts_per_tok=2)
    yield "mixtral", lambda: tf.MixtralConfig(**common, num_local_experts=6, num_experts_per_tok=2)
    yield "gpt2", lambda: tf.GPT2Config(n_embd=h, n_layer=n, n_head=heads, vocab_size=1000)
    yield "gptneox", lambda: tf.GPTNeoXConfig(hidden_size=h, num_hidden_layers=n,
        num_attention_heads=heads, intermediate_size=h * 2, vocab_size=1000)

def step(model, ids, ctx=None):
    for p in model.parameters():
        p.grad = None
    with (ctx if ctx is not None else contextlib.nullcontext()):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    cache = getattr(out, "past_key_values", None)
    return out.loss.detach(), [p.grad.clone() if p.grad is not None else None
                               for p in model.parameters()], cache is not None

def same(a, b):
    return torch.equal(a[0], b[0]) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a[1], b[1]))

def case(model, ids, ref, label, make, steps=12):
    try:
        ctx = make()
        ok = True
        for i in range(steps):
            got = step(model, ids, ctx)
            ok = ok and same(ref, got)
        plan = ""
        jb = getattr(ctx, "joint_budget", None)
        if jb is not None and jb.plan is not None:
            plan = "".join(c[0].upper() for c in jb.unit_choices(jb.plan))
        print(f"  {label:28s} identical={ok} {plan}", flush=True)
    except Exception as e:
        print(f"  {label:28s} RAISED {type(e).__name__}: {str(e)[:300]}", flush=True)
        traceback.print_exc(limit=-3)

only = sys.argv[1:]
for name, make_config in configs():
    if only and name not in only:
        continue
    try:
        config = make_config()
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").cuda().train()
    except Exception as e:
        print(f"## {name}: not built ({type(e).__name__}: {e})"); continue
    ids = torch.randint(0, 1000, (2, 512), device="cuda")
    ref = step(model, ids); again = step(model, ids)
    layers = actoffload.find_layers(model)
    print(f"## {name}: use_cache={model.config.use_cache} cache returned={ref[2]} "
          f"deterministic={same(ref, again)} layers={len(layers)} {type(layers[0]).__name__}", flush=True)
    case(model, ids, ref, "budget 0.5", lambda: actoffload.OffloadActivations(model, budget_fraction=0.5))
    case(model, ids, ref, "budget 0.35 block", lambda: actoffload.OffloadActivations(
        model, budget_fraction=0.35, granularity="block"))
    case(model, ids, ref, "torchtune default", lambda: actoffload.OffloadActivations())
    case(model, ids, ref, "recipe helper", lambda: actoffload.get_act_offloading_ctx_manager(model, True))
    case(model, ids, ref, "layers k=2", lambda: actoffload.OffloadActivations(model, num_layers=2))
    try:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        case(model, ids, ref, "hf ckpt + budget 0.6", lambda: actoffload.OffloadActivations(model, budget_fraction=0.6))
        case(model, ids, ref, "hf ckpt + torchtune", lambda: actoffload.OffloadActivations())
        model.gradient_checkpointing_disable()
    except Exception as e:
        print("  hf ckpt RAISED", type(e).__name__, e)
    del model
    torch.cuda.empty_cache()
