"""Session 6 diagnosis: the cost of our context on a settled plan that
offloads nothing (lean or through the engine) against checkpointing the same
layers, on GPT-2 and on a compiled Llama; interleaved, one process."""
import contextlib, statistics, sys, time
import torch
import actoffload
from actoffload import budget, demo
from torch._dynamo.utils import counters

def step(model, ids, wrap):
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize(); t = time.perf_counter()
    with wrap():
        out = model(input_ids=ids, labels=ids)
    out.loss.backward(); torch.cuda.synchronize()
    return time.perf_counter() - t

@contextlib.contextmanager
def with_lean(ctx, lean):
    budget.LEAN = lean
    try:
        with ctx:
            yield
    finally:
        budget.LEAN = True

def run(name, kind, compiled, fraction, k, rounds):
    torch.manual_seed(0)
    model = demo.build_model(kind, 2048, 8, "sdpa", 0)
    if compiled:
        for layer in demo.decoder_layers(model):
            layer.compile()
    ids = torch.randint(0, model.config.vocab_size, (1, 4096)).cuda()
    for _ in range(2):
        step(model, ids, contextlib.nullcontext)
    ctx = actoffload.OffloadActivations(model, budget_fraction=fraction, allow_offload=False)
    n = 0
    while ctx.joint_budget.measuring or n < 2:
        n += 1
        step(model, ids, lambda: ctx)
    plan = "".join(c[0].upper() for c in ctx.joint_budget.unit_choices(ctx.joint_budget.plan))
    systems = {"none": contextlib.nullcontext,
               f"ckpt{k}": lambda: demo.checkpoint_layers(model, k),
               "joint-lean": lambda: with_lean(ctx, True),
               "joint-engine": lambda: with_lean(ctx, False)}
    for w in systems.values():
        step(model, ids, w); step(model, ids, w)
    before = {key: dict(v) for key, v in counters.items()}
    times = {key: [] for key in systems}
    for _ in range(rounds):
        for key, w in systems.items():
            times[key].append(step(model, ids, w))
    after = {key: dict(v) for key, v in counters.items()}
    base = statistics.median(times["none"])
    print(f"## {name}: plan {plan}, no offload {base*1e3:.1f} ms", flush=True)
    for key, ts in times.items():
        ratios = [t / b for t, b in zip(ts, times["none"])]
        q = statistics.quantiles(ratios, n=4)
        print(f"  {key:>13s}  x{statistics.median(ratios):.3f}  IQR {q[2]-q[0]:.3f}", flush=True)
    changed = {k2: {kk: after[k2].get(kk, 0) - before.get(k2, {}).get(kk, 0) for kk in after[k2]
                    if after[k2].get(kk, 0) != before.get(k2, {}).get(kk, 0)} for k2 in after}
    print("  dynamo counters changed while timed:", {k2: v for k2, v in changed.items() if v}, flush=True)
    del model, ctx
    torch.cuda.empty_cache()

which = sys.argv[1:] or ["gpt2", "compiled"]
if "gpt2" in which:
    run("gpt2 h2048 0.8", "gpt2", False, 0.8, 3, 15)
if "compiled" in which:
    run("llama h2048 compiled 0.6", "llama", True, 0.6, 7, 15)
