"""One eager Llama decoder layer (hidden 2048, 4096 tokens, bf16): bytes it leaves
allocated and fwd+bwd time, plain, whole re-run, PyTorch's selective checkpoint and
actoffload's replayable one (recompute.py), and its wrapper; then the policy's op
counts. Run on the GPU machine: PYTHONPATH=python python3 THIS_FILE."""
import collections, functools, torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, CheckpointPolicy
from actoffload import demo, recompute
model = demo.build_model("llama", 2048, 1, "eager", 0)
layer = demo.decoder_layers(model)[0]
x = torch.randn(1, 4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
pos = model.model.rotary_emb(x, torch.arange(4096, device="cuda")[None])
seen = collections.Counter()
def logpolicy(ctx, op, *a, **k):
    p = recompute._policy(ctx, op, *a, **k)
    if not ctx.is_recompute: seen[(str(op), p.name)] += 1
    return p
def run(mode):
    torch.cuda.synchronize(); before = torch.cuda.memory_allocated()
    kw = dict(position_embeddings=pos, attention_mask=None)
    if mode is None: out = layer(x, **kw)
    elif mode == "full": out = checkpoint(layer, x, use_reentrant=False, **kw)
    elif mode == "torch-sac": out = checkpoint(layer, x, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(logpolicy), **kw)
    elif mode == "wrapper":
        class B:
            def checkpoints(s, i): return "selective"
        layer.forward = recompute.Checkpointed(B(), 0, layer.forward)
        out = layer(x, **kw)
        recompute.restore_forward(layer)
    else: out = checkpoint(layer, x, use_reentrant=False, context_fn=recompute._selective_contexts, **kw)
    out = out[0] if isinstance(out, tuple) else out
    torch.cuda.synchronize(); left = torch.cuda.memory_allocated() - before
    out.float().sum().backward(); del out
    torch.cuda.synchronize()
    import time
    t = time.perf_counter()
    for _ in range(5):
        o = layer(x, **kw) if mode is None else checkpoint(layer, x, use_reentrant=False, **(dict(context_fn=recompute._selective_contexts) if mode in ("ours", "torch-sac") else {}), **kw)
        (o[0] if isinstance(o, tuple) else o).float().sum().backward()
    torch.cuda.synchronize()
    print(mode, f"left {left/2**20:.0f} MiB, fwd+bwd {(time.perf_counter()-t)/5*1e3:.2f} ms", flush=True)
for m in (None, "full", "torch-sac", "ours", "wrapper"):
    run(m)
for k, v in sorted(seen.items()): print(v, k)
