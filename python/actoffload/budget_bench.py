"""python -m actoffload.budget_bench --models llama,llama-eager,gpt2,moe --out DIR

Ask for memory, get the fastest step: for each model (Hugging Face, from a
config, bf16 on the GPU) and each budget (a fraction of no offloading's
peak), in one process:
  - checkpoint-only: per-layer torch.utils.checkpoint of the first k layers,
    the fastest k whose measured peak is within the budget;
  - offload-only: TE's front door offloading k of n layers, likewise;
  - joint: OffloadActivations(model, budget_bytes=...) (budget.py), per
    layer and per block, after its profile and warm-up iterations.
The peak is what the user measures: the step's max_memory_allocated above
memory_allocated before the forward (gradients zeroed in place, as
zero_grad(set_to_none=False): they are allocated before the step; with
--set-to-none they are freed before it, as zero_grad()'s default, and
allocated in its backward).
Checkpoint-only and offload-only take the least k whose measured peak is
within the budget (their step grows with k). Step times: the machine's speed
drifts (shared hosts: a whole row ran 1.5x slower at times), so each
budget's systems are timed interleaved, one step each per round with a step
of no offloading, for --steps rounds; a system's step ratio is the median
over rounds of its step over that round's no-offload step, its spread the
ratios' interquartile range. Each step is timed with Python's garbage
collector off (collected before it), as timeit does.
The table has the plan, its predicted step and its limit (the least step
any keep/offload/recompute choice of the same units can have, from the same
profile; the time outside the units is added to both as measured). The
picture (frontier.png) is each system's memory-versus-step frontier.
"""

import argparse
import contextlib
import gc
import json
import os
import statistics
import time

import torch

import actoffload
from . import demo

MODELS = {  # name -> (model, attention)
    "llama": ("llama", "sdpa"), "llama-eager": ("llama", "eager"),
    "gpt2": ("gpt2", "sdpa"), "moe": ("moe", "sdpa")}


def timed_steps(model, ids, wrap, steps):
    """Runs `steps` steps; returns (median s, spread, peak bytes, loss, grads).
    Gradients are zeroed in place before each step (zero_grad(set_to_none=
    False)), or freed (set_to_none=True: then they are allocated inside the
    step and count in its peak) where the model's `set_to_none` says so."""
    times, peak, loss = [], 0, None
    set_to_none = getattr(model, "bench_set_to_none", False)
    for _ in range(steps):
        for p in model.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        gc.collect()  # Python's collector pauses are not the step's: timed without it
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        gc.disable()
        t0 = time.perf_counter()
        try:
            with wrap():
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            torch.cuda.synchronize()
        finally:
            gc.enable()
        times.append(time.perf_counter() - t0)
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
        loss = out.loss.detach().float()
        del out
    grads = [p.grad.detach().clone() for p in model.parameters()]
    median = statistics.median(times)
    return {"time": median, "spread": max(times) / min(times) - 1, "peak": peak,
            "loss": loss, "grads": grads}


def identical(reference, result):
    if not torch.equal(reference["loss"], result["loss"]):
        return "loss differs"
    diff = max(((a.float() - b.float()).abs().max().item()
                for a, b in zip(reference["grads"], result["grads"])
                if not torch.equal(a, b)), default=0.0)
    return "yes" if diff == 0 else f"max|dgrad| {diff:.2g}"


def sweep(model, ids, n, steps, kind):
    """Each k's measured point for checkpointing or TE offloading."""
    points = []
    for k in range(0, n + 1 if kind == "checkpoint" else n):
        if k == 0:
            continue
        if kind == "checkpoint":
            wrap = lambda k=k: demo.checkpoint_layers(model, k)  # noqa: E731
        else:
            ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=k, model_layers=n)
            wrap = lambda ctx=ctx, sync=sync: demo.te_hooks(model, ctx, sync)  # noqa: E731
        timed_steps(model, ids, wrap, 2)  # warm-up
        r = timed_steps(model, ids, wrap, steps)
        del r["grads"]  # the rows' gradients are checked when timed interleaved
        r["k"] = k
        points.append(r)
    return points


def best_within(points, budget):
    """The least k whose peak is within the budget (the step grows with k:
    more layers re-run or copied)."""
    fits = [p for p in points if p["peak"] <= budget]
    return min(fits, key=lambda p: p["k"]) if fits else None


def wrap_for(model, n, label, k):
    """A fresh context for checkpointing or TE's offloading of k layers."""
    if label == "checkpoint":
        return lambda: demo.checkpoint_layers(model, k)
    ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=k, model_layers=n)
    return lambda: demo.te_hooks(model, ctx, sync)


def interleaved(model, ids, wraps, rounds, reference):
    """Per system (label -> wrap): the median and interquartile range of its
    step over the same round's no-offload step, its peak, and whether its
    last step's loss and gradients are `reference`'s."""
    reference_run = reference
    systems = [("none", contextlib.nullcontext)] + list(wraps.items())
    for _, wrap in systems:
        timed_steps(model, ids, wrap, 1)  # pinned buffers, caches
    ratios = {label: [] for label, _ in systems}
    last = {}
    for _ in range(rounds):
        reference = None
        for label, wrap in systems:
            r = timed_steps(model, ids, wrap, 1)
            reference = r["time"] if reference is None else reference
            ratios[label].append(r["time"] / reference)
            r["peak"] = max(r["peak"], last.get(label, {}).get("peak", 0))
            r["identical"] = identical(reference_run, r) if label != "none" else ""
            del r["grads"]
            last[label] = r
    out = {}
    for label, _ in systems[1:]:
        q = statistics.quantiles(ratios[label], n=4) if rounds > 1 else [ratios[label][0]] * 3
        out[label] = dict(last[label], ratio=statistics.median(ratios[label]),
                          spread=q[2] - q[0])
    return out


def joint(model, ids, budget, granularity, steps, reference):
    ctx = actoffload.OffloadActivations(model, budget_bytes=budget, granularity=granularity)
    note = ""
    for _ in range(actoffload.budget.WARMUP_ITERATIONS + 3):
        try:
            timed_steps(model, ids, lambda: ctx, 1)
        except ValueError as refused:  # SPEC §7.8: told once, the smallest planned
            note = str(refused)
    r = timed_steps(model, ids, lambda: ctx, 2)
    del r["grads"]
    jb = ctx.joint_budget
    units_ns = sum(u["forward_ns"] + u["backward_ns"] for u in jb.profile["units"])
    outside_ns = reference["time"] * 1e9 - units_ns  # the step outside the units
    limit = jb.limit()
    r.update(plan=jb.unit_choices(jb.plan), predicted=(jb.predicted_step(jb.plan) + outside_ns) / 1e9,
             limit=None if limit is None else (limit + outside_ns) / 1e9,
             note=note, budget=jb.budget_bytes,
             text=ctx.budget_plan() + "warm-up trials (measured step ms / predicted, "
             "peak MiB / predicted, plan): " + ", ".join(
                 f"({t / 1e6:.1f}/{(q['step_ns'] + outside_ns) / 1e6:.1f}, {p / 2**20:.0f}/"
                 f"{(q['peak_bytes'] + jb.profile['outside']) / 2**20:.0f}, "
                 f"{short_plan(jb.unit_choices(q))})" for t, p, q in jb._all_trials))
    # What the model saw and what the race measured, to replay the model
    # offline (profiles-<model>.json): the units as the race fitted them,
    # the copy bandwidths, the units' budget, and each trial's plan, step
    # and peak.
    r["model"] = {"units": [dict(u) for u in jb.model_units], "bandwidths": list(jb.bandwidths),
                  "units_budget": jb._units_budget, "outside": jb.profile["outside"],
                  "outside_ns": outside_ns, "index": list(jb._index),
                  "trials": [{"step_ns": t, "peak": p, "choice": list(q["choice"])}
                             for t, p, q in jb._all_trials]}
    r["wrap"] = lambda: ctx
    return r


def short_plan(choice):
    return "".join({"keep": "K", "offload": "O", "recompute": "R", "selective": "S",
                    "selective-offload": "Q"}[c]
                   for c in choice)


def run_model(name, args, out):
    kind, attn = MODELS[name]
    if attn == "eager":
        torch.use_deterministic_algorithms(True, warn_only=True)
    model = demo.build_model(kind, args.hidden, args.layers, attn, args.seed,
                             vocab=args.vocab, ffn=args.ffn)
    model.bench_set_to_none = args.set_to_none
    if args.compile:  # each decoder layer (recomputed around its compiled call: recompute.compiled)
        for layer in demo.decoder_layers(model):
            layer.compile()
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq), generator=gen).cuda()
    n = len(demo.decoder_layers(model))
    timed_steps(model, ids, contextlib.nullcontext, 2)
    reference = timed_steps(model, ids, contextlib.nullcontext, args.steps)
    again = timed_steps(model, ids, contextlib.nullcontext, args.steps)
    ckpt = sweep(model, ids, n, args.steps, "checkpoint")
    offl = sweep(model, ids, n, args.steps, "offload")
    p0, t0 = reference["peak"], reference["time"]
    head = (f"# {name}: hidden {args.hidden}, {n} layers, {args.seq} tokens, vocab "
            f"{model.config.vocab_size}, bf16, gradients "
            f"{'set to None' if args.set_to_none else 'zeroed in place'}"
            f"{', each layer compiled' if args.compile else ''}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}; no offload "
            f"{p0 / 2**20:.0f} MiB, {t0 * 1e3:.1f} ms (spread {reference['spread']:.3f}; "
            f"again x{again['time'] / t0:.3f}, {identical(reference, again)})")
    del again["grads"]
    lines = [head, f"{'budget':>7s} {'system':>14s} {'plan':>18s} {'mem x':>6s} "
             f"{'step x':>7s} {'spread':>6s} {'pred x':>7s} {'limit x':>7s}  identical"]
    rows, plans, dumps = [], [], []
    for fraction in args.fractions:
        budget = int(fraction * p0)
        entries = []
        for label, points in (("checkpoint", ckpt), ("offload", offl)):
            p = best_within(points, budget)
            if p is not None:
                p = dict(p, wrap=wrap_for(model, n, label, p["k"]))
            entries.append((label, p, f"k={p['k']}/{n}" if p else "none fits"))
        for granularity in args.granularities:
            r = joint(model, ids, budget, granularity, args.steps, reference)
            entries.append((f"joint/{granularity}", r, short_plan(r["plan"])))
        timed = interleaved(model, ids, {label: r["wrap"] for label, r, _ in entries
                                         if r is not None}, args.steps, reference)
        for label, r, _ in entries:
            if r is not None:
                r.update(peak=max(r["peak"], timed[label]["peak"]),
                         time=timed[label]["ratio"] * t0, spread=timed[label]["spread"],
                         identical=timed[label]["identical"])
        del timed
        for label, r, plan in entries:
            row = {"model": name, "fraction": fraction, "system": label, "plan": plan}
            if r is None:
                lines.append(f"{fraction:7.2f} {label:>14s} {plan:>18s}")
                rows.append(row)
                continue
            pred = r.get("predicted")
            limit = r.get("limit")
            row.update(mem=r["peak"] / p0, step=r["time"] / t0, spread=r["spread"],
                       predicted=pred and pred / t0, limit=limit and limit / t0,
                       identical=r["identical"], note=r.get("note", ""))
            rows.append(row)
            if "text" in r:
                plans.append(f"## {name}, budget {fraction}, {label}\n{r['text']}")
            if "model" in r:
                dumps.append(dict(r["model"], fraction=fraction, system=label))
            lines.append(
                f"{fraction:7.2f} {label:>14s} {plan:>18s} {row['mem']:6.3f} "
                f"{row['step']:7.3f} {r['spread']:6.3f} "
                f"{'' if pred is None else f'{pred / t0:7.3f}':>7s} "
                f"{'' if limit is None else f'{limit / t0:7.3f}':>7s}  {row['identical']}"
                + (" (refused: planned the smallest)" if row["note"] else ""))
    frontier = {"checkpoint": [(p["peak"] / p0, p["time"] / t0) for p in ckpt],
                "offload": [(p["peak"] / p0, p["time"] / t0) for p in offl]}
    print("\n".join(lines), flush=True)
    del model
    torch.cuda.empty_cache()
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"plans-{name}.txt"), "w") as f:
            f.write("\n\n".join(plans))
        with open(os.path.join(out, f"profiles-{name}.json"), "w") as f:
            json.dump(dumps, f)
    return lines, rows, frontier


def draw(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, rows, frontier) in zip(axes[0], results):
        for label, points in frontier.items():
            points = sorted(points)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o--", label=label + " (k)")
        for system in sorted({r["system"] for r in rows if r["system"].startswith("joint")}):
            pts = sorted((r["mem"], r["step"]) for r in rows
                         if r["system"] == system and "mem" in r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "s-", label=system)
        ax.set_title(name)
        ax.set_xlabel("peak memory / no offloading")
        ax.set_ylabel("step time / no offloading")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,llama-eager,gpt2,moe")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fractions", default="0.8,0.6,0.45,0.3,0.2")
    parser.add_argument("--granularities", default="layer")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary size (default: demo.build_model's)")
    parser.add_argument("--ffn", type=float, default=None,
                        help="Llama's intermediate size over hidden (default 2.6875)")
    parser.add_argument("--set-to-none", action="store_true",
                        help="free the gradients before each step (zero_grad()'s default) "
                        "instead of zeroing them in place")
    parser.add_argument("--compile", action="store_true",
                        help="compile each decoder layer (layer.compile()); checkpointing "
                        "and the joint plan's re-runs wrap each compiled layer's call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for table.txt, rows.json, frontier.png")
    args = parser.parse_args(argv)
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.granularities = args.granularities.split(",")
    if not torch.cuda.is_available():
        raise SystemExit("actoffload.budget_bench needs a CUDA GPU")
    results, all_lines, all_rows = [], [], []
    for name in args.models.split(","):
        lines, rows, frontier = run_model(name, args, args.out)
        results.append((name, rows, frontier))
        all_lines += lines + [""]
        all_rows += rows
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.txt"), "w") as f:
            f.write("\n".join(all_lines))
        with open(os.path.join(args.out, "rows.json"), "w") as f:
            json.dump({"rows": all_rows, "frontier": {n: fr for n, _, fr in results}}, f,
                      indent=1)
        draw(results, os.path.join(args.out, "frontier.png"))


if __name__ == "__main__":
    main()
