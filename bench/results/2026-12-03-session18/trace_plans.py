"""Issue 30, session 10: where an offloading plan's time goes on eager
Llama h2048 x 4096 tokens (budget 0.8). The race measured ORKKKKKK 4.6% over
its prediction and RRKKKKKK 0.5% (session 9, H200). Runs each plan the
race tried, after the warm-up, for timed steps, then one step under
torch.profiler, and prints per plan: the step, the compute stream's kernel
time and its idle gaps, the copies' time and bandwidth, and how much slower
the same kernels run while a copy runs beside them.

    PYTHONPATH=python python trace_eager.py OUT_DIR [FRACTION [HIDDEN TOKENS VOCAB FFN ATTN]]

(Session 12 added the model's shape as arguments, e.g. the issue's SDPA
Llama: OUT 0.41 4096 8192 8192 2.75 sdpa; and a trace of the step without
offloading. Without them it runs session 10's model.)
"""
import collections
import contextlib
import gzip
import json
import os
import statistics
import sys

import torch

import actoffload
from actoffload import demo
from actoffload.budget_bench import short_plan

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
fraction = float(sys.argv[2]) if len(sys.argv) > 2 else 0.8
torch.use_deterministic_algorithms(True, warn_only=True)
hidden, tokens, vocab, ffn, attn = (
    (int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7])
    if len(sys.argv) > 7 else (2048, 4096, 32000, None, "eager"))
model = demo.build_model("llama", hidden, 8, attn, 0, vocab=vocab, ffn=ffn)
ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0)).cuda()


def step(ctx):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


def timed(ctx, n=6):
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        step(ctx)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[1:])


def intervals(events, pred):
    return sorted((e["ts"], e["ts"] + e["dur"], e) for e in events if pred(e))


def analyse(trace_path):
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = intervals(events, lambda e: e.get("cat") == "kernel")
    copies = intervals(events, lambda e: e.get("cat") == "gpu_memcpy")
    if not kernels:
        return "no kernels traced"
    streams = collections.Counter(k[2]["args"].get("stream") for k in kernels)
    main = streams.most_common(1)[0][0]
    ks = [k for k in kernels if k[2]["args"].get("stream") == main]
    busy = sum(e - s for s, e, _ in ks)
    span = ks[-1][1] - ks[0][0]
    gaps = sorted(((ks[i + 1][0] - ks[i][1], ks[i][2]["name"][:60], ks[i + 1][2]["name"][:60])
                   for i in range(len(ks) - 1)), reverse=True)

    def overlapped(s, e):
        return any(cs < e and ce > s for cs, ce, _ in copies)
    by_name = collections.defaultdict(lambda: [[], []])
    for s, e, k in ks:
        by_name[k["name"]][overlapped(s, e)].append(e - s)
    slow = []
    for name, (alone, beside) in by_name.items():
        if len(alone) >= 3 and len(beside) >= 3:
            slow.append((sum(beside) - len(beside) * statistics.median(alone),
                         statistics.median(beside) / statistics.median(alone), len(beside), name[:70]))
    slow.sort(reverse=True)
    lines = [f"compute stream {main}: span {span / 1e3:.2f} ms, kernels {busy / 1e3:.2f} ms, "
             f"idle {(span - busy) / 1e3:.2f} ms in {len(ks) - 1} gaps; largest gaps (us): "
             + "; ".join(f"{g:.0f} after {a}" for g, a, _ in gaps[:6])]
    for kind in ("Memcpy DtoH", "Memcpy HtoD"):
        cs = [c for c in copies if c[2]["name"].startswith(kind)]
        t = sum(e - s for s, e, _ in cs)
        nbytes = sum(c[2]["args"].get("bytes", 0) for c in cs)
        if cs:
            lines.append(f"{kind}: {len(cs)} copies, {nbytes / 1e9:.2f} GB, {t / 1e3:.2f} ms busy, "
                         f"{nbytes / max(t, 1) / 1e3:.1f} GB/s while busy, from {(cs[0][0] - ks[0][0]) / 1e3:.1f} "
                         f"to {(cs[-1][1] - ks[0][0]) / 1e3:.1f} ms")
    extra = sum(x[0] for x in slow)
    lines.append(f"kernels beside a copy: {extra / 1e3:.2f} ms more than alone; the most: " +
                 "; ".join(f"{n} x{r:.2f} ({c}) +{d / 1e3:.2f} ms" for d, r, c, n in slow[:5]))
    return "\n".join(lines)


report = []
torch.cuda.synchronize()
for _ in range(2):
    step(contextlib.nullcontext())
plain = timed(contextlib.nullcontext())
path = os.path.join(out_dir, "trace-plain.json")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                        torch.profiler.ProfilerActivity.CPU]) as prof:
    step(contextlib.nullcontext())
    torch.cuda.synchronize()
prof.export_chrome_trace(path)
report.append(f"no offload: {plain:.2f} ms\n" + analyse(path))
os.remove(path)
ctx = actoffload.OffloadActivations(model, budget_fraction=fraction)
jb = ctx.joint_budget
for _ in range(actoffload.budget.WARMUP_ITERATIONS + 3):
    step(ctx)
kept = short_plan(jb.unit_choices(jb.plan))
trials = {}
for t, p, q in jb._all_trials:
    trials.setdefault(short_plan(jb.unit_choices(q)), (t, p, q))
report.append(f"kept {kept}; trials: " + ", ".join(
    f"{name} {t / 1e6:.1f} ms" for name, (t, p, q) in trials.items()))
for name, (t, p, plan) in trials.items():
    jb._apply(plan)
    for _ in range(2):
        step(ctx)
    ms = timed(ctx)
    path = os.path.join(out_dir, f"trace-{name}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        step(ctx)
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    report.append(f"\n== {name}: {ms:.2f} ms (x{ms / plain:.3f}); predicted "
                  f"{jb.predicted_step(plan) / 1e6:.1f} ms for the units\n" + analyse(path))
    if name.startswith("O") or "O" in name:
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            g.write(f.read())
    os.remove(path)
text = "\n".join(report)
print(text)
with open(os.path.join(out_dir, f"trace-{attn}-{hidden}-{fraction}.txt"), "w") as f:
    f.write(text + "\n")
