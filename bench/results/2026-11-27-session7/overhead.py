"""Session 7: where the engine's per-step cost goes. Per system, interleaved:
wall step (synced), CPU time of the forward call and of backward() (no sync
in between), on GPT-2 h2048 0.8 (recompute-only plan: lean vs engine) and
eager Llama h2048 0.8 (a plan that offloads)."""
import contextlib, statistics, sys, time
import torch
import actoffload
from actoffload import _common, budget, demo

def step(model, ids, wrap):
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize(); t0 = time.perf_counter()
    with wrap():
        out = model(input_ids=ids, labels=ids)
    t1 = time.perf_counter()
    out.loss.backward()
    t2 = time.perf_counter()
    torch.cuda.synchronize(); t3 = time.perf_counter()
    return t3 - t0, t1 - t0, t2 - t1

@contextlib.contextmanager
def with_lean(ctx, lean):
    budget.LEAN = lean
    try:
        with ctx:
            yield
    finally:
        budget.LEAN = True

@contextlib.contextmanager
def wide(ctx):
    """The engine's hooks in force for the whole forward (as before per-unit hooks)."""
    real = _common.saved_hooks_top
    _common.saved_hooks_top = lambda: NotImplemented
    try:
        ctx.__enter__()
    finally:
        _common.saved_hooks_top = real
    try:
        yield
    except BaseException:
        ctx.__exit__(*sys.exc_info()); raise
    ctx.__exit__(None, None, None)

def run(name, kind, attn, fraction, k, rounds, allow_offload, allow_recompute=True):
    torch.manual_seed(0)
    model = demo.build_model(kind, 2048, 8, attn, 0)
    ids = torch.randint(0, model.config.vocab_size, (1, 4096)).cuda()
    for _ in range(2):
        step(model, ids, contextlib.nullcontext)
    ctx = actoffload.OffloadActivations(model, budget_fraction=fraction, allow_offload=allow_offload,
                                        allow_recompute=allow_recompute)
    n = 0
    while ctx.joint_budget.measuring or n < 2:
        n += 1
        step(model, ids, lambda: ctx)
    jb = ctx.joint_budget
    plan = "".join(c[0].upper() for c in jb.unit_choices(jb.plan))
    systems = {"none": contextlib.nullcontext,
               f"ckpt{k}": lambda: demo.checkpoint_layers(model, k),
               "joint-engine": lambda: with_lean(ctx, False),
               "joint-wide": lambda: with_lean(wide(ctx), False)}
    if "offload" not in jb.plan["choice"]:
        systems["joint-lean"] = lambda: with_lean(ctx, True)
    for w in systems.values():
        step(model, ids, w); step(model, ids, w)
    times = {key: [] for key in systems}
    for _ in range(rounds):
        for key, w in systems.items():
            times[key].append(step(model, ids, w))
    base = statistics.median(t[0] for t in times["none"])
    print(f"## {name}: plan {plan}, no offload {base*1e3:.1f} ms", flush=True)
    for key, ts in times.items():
        ratios = [t[0] / b[0] for t, b in zip(ts, times["none"])]
        q = statistics.quantiles(ratios, n=4)
        print(f"  {key:>13s}  x{statistics.median(ratios):.3f}  IQR {q[2]-q[0]:.3f}  "
              f"wall {statistics.median(t[0] for t in ts)*1e3:.1f} ms  cpu fwd "
              f"{statistics.median(t[1] for t in ts)*1e3:.1f}  cpu bwd {statistics.median(t[2] for t in ts)*1e3:.1f}",
              flush=True)
    # One profiled step of the engine: the CPU ops that cost most.
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(model, ids, lambda: with_lean(ctx, False))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), flush=True)
    print(ctx.budget_plan(), flush=True)
    del model, ctx
    torch.cuda.empty_cache()

which = sys.argv[1:] or ["gpt2", "llama"]
if "gpt2" in which:
    run("gpt2 h2048 0.8", "gpt2", "sdpa", 0.8, 3, 30, False)
if "llama" in which:
    run("llama eager h2048 0.85 offload-only", "llama", "eager", 0.85, 1, 20, True, False)
    run("llama eager h2048 0.8", "llama", "eager", 0.8, 2, 20, True)
