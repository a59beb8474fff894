"""The memory budget (OffloadActivations(layers, budget_fraction=f)) on
batches of varying length (dynamic padding): per step, the length, the peak
above the memory before the step (torch.cuda.max_memory_allocated) as a
fraction of the same batch's peak without the package (measured once per
length first), the step time, whether the warm-up is still measuring, and
what the package said or raised.

    PYTHONPATH=python python bench/results/2026-12-11-session26/varlen_budget.py [fraction] [lengths] [steps] [attention] [hidden]

(session 25's script, which is session 15's with the attention kind as its
fourth argument, the warnings about storages the caller still holds left
out, and the race's fitted growth printed at the end; here each step also
prints the length its plan was made for ("for", 1.00: the race's own) and
its choices, K keep, O offload, R recompute, S selective, Q
selective-offload; a fifth argument sets the hidden size, 2048 unless given)
"""
import sys
import time
import warnings

import torch

import actoffload
from actoffload.demo import build_model, decoder_layers

fraction = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else
                            "2048,1536,2560,1024,3072,2048").split(",")]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 48
attention = sys.argv[4] if len(sys.argv) > 4 else "sdpa"
hidden = int(sys.argv[5]) if len(sys.argv) > 5 else 2048
model = build_model("llama", hidden, 8, attention, 0, vocab=8192)
gen = torch.Generator().manual_seed(0)
LETTER = {"keep": "K", "offload": "O", "recompute": "R", "selective": "S",
          "selective-offload": "Q"}


def step(ids, ctx):
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with ctx if ctx is not None else torch.enable_grad():
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, time.perf_counter() - start


plain = {}
for n in sorted(set(lengths)):
    ids = torch.randint(0, 8192, (1, n), generator=gen).cuda()
    step(ids, None)
    plain[n] = min(step(ids, None) for _ in range(3))
    print(f"no offload, {n} tokens: {plain[n][0] / 2**20:.0f} MiB, {plain[n][1] * 1e3:.1f} ms")
ctx = actoffload.OffloadActivations(decoder_layers(model), budget_fraction=fraction)
print(f"budget_fraction {fraction}; lengths cycle {lengths}; attention {attention}")
for i in range(steps):
    n = lengths[i % len(lengths)]
    ids = torch.randint(0, 8192, (1, n), generator=gen).cuda()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            mem, t = step(ids, ctx)
            raised = ""
        except ValueError as error:
            mem, t, raised = 0, 0.0, str(error)[:150]
    joint = ctx.joint_budget
    said = [str(w.message)[:160] for w in seen if "actoffload" in str(w.message)
            and "stay on device" not in str(w.message)]
    ran = joint.plan  # the plan this step ran (the next forward's enter may change it)
    made_for = 0.0 if ran is None else ran.get("for_ratio", 1.0)
    letters = "" if ran is None else "".join(LETTER[c] for c in joint.unit_choices(ran))
    print(f"{i:3d} {n:5d} mem/plain {mem / plain[n][0]:.3f} mem/budget "
          f"{mem / max(joint.budget_bytes or 1, 1):.3f} step/plain {t / plain[n][1]:.3f} "
          f"measuring {joint.measuring!s:5} for {made_for:.2f} {letters:8} {raised} {said[:1]}")
plan = ctx.joint_budget.plan
print("plan:", None if plan is None else ctx.joint_budget.unit_choices(plan), "budget bytes",
      ctx.joint_budget.budget_bytes)
race = ctx.joint_budget._race
print("length exponent:", None if race is None else race.length_exponent)
