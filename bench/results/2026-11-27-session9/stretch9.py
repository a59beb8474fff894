"""Session 9: selective-offload units per stretch (session 8's stretch.py, Q added;
the per-stretch model treats Q as selective kept on device). Session 8 diagnosis (issue 30, item 1): where a raced plan's measured peak
exceeds the joint model's. For forced plans (keep / recompute / selective,
no offload) this measures the peak of every stretch of the step (each
unit's forward, the head, each unit's backward) with the allocator's
counters, and prints beside it what the model (engine/plan/joint_model.cc,
no offload) predicts for the same stretch from the raw profile."""
import contextlib, gc, json, sys
import torch
import actoffload
from actoffload import _common, demo

MiB = 2 ** 20
kind, attn, hidden, seq, vocab, ffn, fraction = (
    sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
    int(sys.argv[5]) or None, float(sys.argv[6]) or None, float(sys.argv[7]))
plans = sys.argv[8].split(",")
torch.manual_seed(0)
model = demo.build_model(kind, hidden, 8, attn, 0, vocab=vocab, ffn=ffn)
layers = demo.decoder_layers(model)
ids = torch.randint(0, model.config.vocab_size, (1, seq)).cuda()

st = {"on": False}


def pre(i):
    def hook(m, a, k=None):
        if not st["on"] or _common.in_backward():
            return
        st["fwd_before"][i] = torch.cuda.memory_allocated() - st["base"]
        st["marks"].append(("mark", torch.cuda.max_memory_allocated() - st["base"]))
        torch.cuda.reset_peak_memory_stats()
    return hook


def post(i):
    def hook(m, a, out):
        if not st["on"] or _common.in_backward():
            return
        st["fwd_peak"][i] = torch.cuda.max_memory_allocated() - st["base"]
        st["fwd_after"][i] = torch.cuda.memory_allocated() - st["base"]
        torch.cuda.reset_peak_memory_stats()
        t = out[0] if isinstance(out, tuple) else out
        if t.requires_grad:
            def g(grad, i=i):
                top = torch.cuda.max_memory_allocated() - st["base"]
                st["bwd_marks"].append((i, top, torch.cuda.memory_allocated() - st["base"]))
                torch.cuda.reset_peak_memory_stats()
            t.register_hook(g)
    return hook


for i, layer in enumerate(layers):
    layer.register_forward_pre_hook(pre(i))
    layer.register_forward_hook(post(i))


def step(wrap, measure):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    gc.collect(); torch.cuda.synchronize()
    st.update(on=measure, base=torch.cuda.memory_allocated(), fwd_before=[0] * 8,
              fwd_peak=[0] * 8, fwd_after=[0] * 8, marks=[], bwd_marks=[])
    torch.cuda.reset_peak_memory_stats()
    with wrap():
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.cuda.synchronize()
    last = torch.cuda.max_memory_allocated() - st["base"]
    st["on"] = False
    del out
    # backward stretches: the head's (up to unit 7's gradient), then unit i's
    # (from its gradient to unit i-1's), the last from unit 0's to the end.
    marks = st["bwd_marks"]
    bwd = {}
    for j, (i, top, alloc) in enumerate(marks):
        end = marks[j + 1][1] if j + 1 < len(marks) else last
        bwd[i] = (end, alloc)
    head = marks[0][1] if marks else None
    return {"fwd_before": st["fwd_before"], "fwd_peak": st["fwd_peak"],
            "fwd_after": st["fwd_after"], "head": head,
            "bwd_peak": [bwd.get(i, (0, 0))[0] for i in range(8)],
            "bwd_start": [bwd.get(i, (0, 0))[1] for i in range(8)]}


def model_stretches(units, index, outside, choice):
    """The joint model's per-stretch peaks (no offload), bytes above base."""
    n = len(units)
    full = ["keep"] * n
    for i, c in enumerate(choice):
        full[index[i]] = c
    need = [u["input_bytes"] if c == "recompute" else u.get("selective_bytes", 0)
            if c in ("selective", "selective-offload") else u["saved_bytes"] for u, c in zip(units, full)]
    recreated = [u["recompute_bytes"] if c == "recompute" else u["saved_bytes"] - u["selective_bytes"]
                 if c in ("selective", "selective-offload") else 0 for u, c in zip(units, full)]
    fwd, bwd = [], []
    for p in range(n):
        u = units[p]
        ft = u.get("forward_transient_bytes", 0)
        if full[p] in ("selective", "selective-offload"):
            ft = max(ft, u.get("selective_forward_transient_bytes", 0))
        fwd.append(outside + sum(need[:p]) + need[p] + ft)
        extra = max(u.get("backward_transient_bytes", 0),
                    u.get("forward_transient_bytes", 0) if full[p] != "keep" else 0,
                    u.get("selective_backward_transient_bytes", 0) if full[p] in ("selective", "selective-offload") else 0)
        bwd.append(outside + sum(need[:p + 1]) + recreated[p] + extra)
    return [fwd[index[i]] for i in range(8)], [bwd[index[i]] for i in range(8)], fwd[-1]


for _ in range(2):
    step(contextlib.nullcontext, False)
ctx = actoffload.OffloadActivations(model, budget_fraction=fraction)
for it in range(60):
    try:
        step(lambda: ctx, False)
    except ValueError as e:
        print("refused:", e)
    if not ctx.joint_budget.measuring and it > 3:
        break
jb = ctx.joint_budget
print(ctx.budget_plan())
units, index, outside = jb.profile["units"], jb._index, jb.profile["outside"]
print("profile units:", json.dumps([{k: (round(v / MiB, 1) if isinstance(v, int) and not isinstance(v, bool) else v)
                                      for k, v in u.items() if not k.endswith("_ns")} for u in units]))
print("outside MiB", outside / MiB, "budget MiB", jb.budget_bytes / MiB)
names = {"K": "keep", "R": "recompute", "S": "selective", "O": "offload", "Q": "selective-offload"}
d2h, h2d = jb.bandwidths
results = {}
for short in ["KKKKKKKK"] + plans:
    choice = [names[c] for c in short]
    print(short, "plan choice as evaluated below")
    full = ["keep"] * len(units)
    for i, c in enumerate(choice):
        full[index[i]] = c
    budget = jb._units_budget if ("O" in short or "Q" in short) else 1 << 40
    plan = _common.ext().evaluate_joint(units, d2h, h2d, budget, full, True)
    if plan is None:
        print(short, "does not fit the model"); continue
    jb._apply(plan)
    step(lambda: ctx, False)
    r = step(lambda: ctx, True)
    r2 = step(lambda: ctx, True)
    total = torch.cuda.max_memory_allocated()
    mf, mb, mhead = model_stretches(units, index, outside, choice)
    print("plan:", plan["choice"], "released", plan["released_during"], "reloaded", plan["reloaded_during"])
    print(f"\n== {short}: model peak {(plan['peak_bytes'] + outside) / MiB:.0f} MiB "
          f"(raw profile), head stretch measured {r['head'] / MiB:.0f} model {mhead / MiB:.0f}")
    print(" unit | fwd before/after | fwd peak meas/model (diff) | bwd start | bwd peak meas/model (diff) | repeat fwd/bwd peak")
    for i in range(8):
        print(f"  {i}   | {r['fwd_before'][i] / MiB:6.0f} {r['fwd_after'][i] / MiB:6.0f} | "
              f"{r['fwd_peak'][i] / MiB:6.0f} / {mf[i] / MiB:6.0f} ({(r['fwd_peak'][i] - mf[i]) / MiB:+5.0f}) | "
              f"{r['bwd_start'][i] / MiB:6.0f} | {r['bwd_peak'][i] / MiB:6.0f} / {mb[i] / MiB:6.0f} "
              f"({(r['bwd_peak'][i] - mb[i]) / MiB:+5.0f}) | {r2['fwd_peak'][i] / MiB:6.0f} {r2['bwd_peak'][i] / MiB:6.0f}")
    results[short] = {"measured": r, "model_fwd": mf, "model_bwd": mb}
json.dump({"units": units, "index": index, "outside": outside, "results": results},
          open(sys.argv[9], "w"))
