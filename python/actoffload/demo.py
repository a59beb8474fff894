"""python -m actoffload.demo --model llama

A Hugging Face model built from a config (random weights, fixed seed, no
download), bf16 on the GPU, trained for a few steps under each way of saving
memory, all in one run: no offloading (twice: the model's own run-to-run
spread), TE's front door (k of n layers), OffloadActivations with a byte
budget, torch's save_on_cpu, and per-layer checkpointing of k layers. Prints
per mode the peak memory (torch.cuda.max_memory_allocated above the model),
the step time relative to no offloading, and whether the loss and every
parameter gradient are bit-identical to no offloading (max |difference|
otherwise), then the host cost per offloaded tensor of the hooks.
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.utils.checkpoint

import actoffload
from actoffload import recompute


def build_model(name, hidden, layers, attn, seed, vocab=None, ffn=None):
    """A Hugging Face model from a config, random weights, bf16 on the GPU.
    `vocab` replaces the model's vocabulary size (32000, GPT-2's 50257);
    `ffn`, Llama's intermediate size over hidden (2.6875, Llama 2 7B's)."""
    import transformers as tf
    torch.manual_seed(seed)
    heads = max(1, hidden // 128)
    if name == "llama":
        config = tf.LlamaConfig(hidden_size=hidden,
                                intermediate_size=int(hidden * (ffn or 2.6875)),
                                num_hidden_layers=layers, num_attention_heads=heads,
                                num_key_value_heads=heads, vocab_size=vocab or 32000,
                                max_position_embeddings=16384)
    elif name == "gpt2":
        config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads,
                               n_positions=16384, vocab_size=vocab or 50257,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    elif name == "moe":
        config = tf.Qwen2MoeConfig(hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=heads,
                                   intermediate_size=hidden * 2, moe_intermediate_size=hidden // 2,
                                   shared_expert_intermediate_size=hidden * 2,
                                   num_experts=8, num_experts_per_tok=2, vocab_size=vocab or 32000,
                                   max_position_embeddings=16384)
    else:
        raise SystemExit(f"unknown model {name!r} (llama, gpt2, moe)")
    config._attn_implementation = attn
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    model.config.use_cache = False
    return model.to(device="cuda", dtype=torch.bfloat16).train()


def decoder_layers(model):
    return actoffload.find_layers(model)


@contextlib.contextmanager
def te_hooks(model, ctx, sync):
    """What a TE user does with a Hugging Face model: each decoder layer's
    forward inside the context, its output through sync_function."""
    handles = []
    for layer in decoder_layers(model):
        def pre(m, a):
            ctx.__enter__()  # a pre-hook returning a value would replace the args
        handles.append(layer.register_forward_pre_hook(pre))

        def post(m, a, out):
            ctx.__exit__(None, None, None)
            if isinstance(out, tuple):
                return (sync(out[0]),) + out[1:]
            return sync(out)
        handles.append(layer.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def checkpoint_layers(model, k):
    """Per-layer torch.utils.checkpoint on the first k decoder layers; for a
    compiled layer around its compiled call, as Hugging Face's gradient
    checkpointing puts it (and the budget: recompute.compiled)."""
    saved = []
    for layer in decoder_layers(model)[:k]:
        slot = recompute.wrapper_slot(layer)
        own = getattr(layer, slot)

        def wrapped(*args, _own=own, **kwargs):
            return torch.utils.checkpoint.checkpoint(_own, *args, use_reentrant=False, **kwargs)
        saved.append((layer, slot, layer.__dict__.get(slot)))
        setattr(layer, slot, wrapped)
    try:
        yield
    finally:
        for layer, slot, own in saved:
            if own is None and slot == "forward":
                del layer.forward
            else:
                setattr(layer, slot, own)


def step(model, ids, wrap):
    for p in model.parameters():
        p.grad = None
    with wrap():
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach().float()


def run_mode(model, ids, wrap, steps, warmup):
    for _ in range(warmup):
        step(model, ids, wrap)
    times = []
    loss = None
    peak = 0
    for _ in range(steps):
        # What the user measures (SPEC §7.8): the peak above the memory just
        # before the forward, that is after step() frees the gradients.
        for p in model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = step(model, ids, wrap)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return {"time": statistics.median(times), "peak": peak, "loss": loss, "grads": grads}


def compare(reference, result):
    same_loss = torch.equal(reference["loss"], result["loss"])
    diff = 0.0
    for a, b in zip(reference["grads"], result["grads"]):
        if not torch.equal(a, b):
            diff = max(diff, (a.float() - b.float()).abs().max().item())
    return same_loss, diff


def host_cost_us(tensors=2000):
    """Host us per offloaded tensor (actoffload.host_cost)."""
    from . import host_cost
    return host_cost.measure(tensors)["own_offloaded"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama", choices=["llama", "gpt2", "moe"])
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ks", default="2,4,6", help="layers offloaded / checkpointed")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("actoffload.demo needs a CUDA GPU")
    if args.attn == "eager":
        torch.use_deterministic_algorithms(True, warn_only=True)
    model = build_model(args.model, args.hidden, args.layers, args.attn, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=gen).cuda()
    n = len(decoder_layers(model))
    ks = [k for k in (int(v) for v in args.ks.split(",")) if k < n]
    print(f"# {args.model} ({args.attn} attention): hidden {args.hidden}, {n} layers, "
          f"{args.batch}x{args.seq} tokens, bf16, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")

    rows = []
    notes = []
    reference = run_mode(model, ids, contextlib.nullcontext, args.steps, 1)
    again = run_mode(model, ids, contextlib.nullcontext, args.steps, 0)
    rows.append(("no offload", reference))
    rows.append(("no offload (again)", again))
    for k in ks:
        ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=k, model_layers=n)
        rows.append((f"TE front door k={k}/{n}",
                     run_mode(model, ids, lambda: te_hooks(model, ctx, sync), args.steps, 1)))
        rows.append((f"checkpoint k={k}/{n}",
                     run_mode(model, ids, lambda: checkpoint_layers(model, k), args.steps, 1)))
    for k in ks:
        # A byte budget of (n-k)/n of no offloading's peak.
        budget = max(1, int(reference["peak"] * (n - k) / n))
        ctx = actoffload.OffloadActivations(model, budget_bytes=budget)
        try:
            for _ in range(3):  # profiled (one or two iterations), then planned
                step(model, ids, lambda: ctx)
        except ValueError as refused:  # SPEC §7.8: told once, planned for the smallest
            notes.append(f"# byte budget {budget >> 20} MiB refused: {str(refused)[:240]}")
        rows.append((f"byte budget {budget >> 20} MiB (~k={k})",
                     run_mode(model, ids, lambda: ctx, args.steps, 1)))
        stats = ctx.offloader.stats()
        notes.append(f"# byte budget {budget >> 20} MiB: {stats['bytes_offloaded'] >> 20} MiB "
                     f"offloaded in all, {stats['bytes_retained_by_caller'] >> 20} MiB of it "
                     f"held by the caller; {len(ctx.offloader.warnings())} warnings"
                     + (f"; first: {ctx.offloader.warnings()[0][:300]}"
                        if ctx.offloader.warnings() else ""))
    tune = actoffload.get_act_offloading_ctx_manager(model, True)
    rows.append((f"torchtune drop-in (k={n - 1}/{n})",
                 run_mode(model, ids, lambda: tune, args.steps, 1)))
    rows.append(("save_on_cpu(pin_memory)",
                 run_mode(model, ids, lambda: torch.autograd.graph.save_on_cpu(pin_memory=True),
                          args.steps, 1)))

    _, spread = compare(reference, again)
    print(f"{'mode':34s} {'peak MiB':>9s} {'mem x':>6s} {'step ms':>8s} {'time x':>7s}  identical")
    for name, r in rows:
        same_loss, diff = compare(reference, r)
        ident = "yes" if same_loss and diff == 0 else (
            f"loss {'same' if same_loss else 'DIFFERS'}, max|dgrad| {diff:.3g}")
        print(f"{name:34s} {r['peak'] / 2**20:9.0f} {r['peak'] / reference['peak']:6.2f} "
              f"{r['time'] * 1e3:8.1f} {r['time'] / reference['time']:7.3f}  {ident}")
    for note in notes:
        print(note)
    print(f"# run-to-run spread of no offloading: max|dgrad| {spread:.3g}")
    print(f"# host cost per offloaded tensor (push+pop+steps, hooks included): "
          f"{host_cost_us():.2f} us")


if __name__ == "__main__":
    main()
