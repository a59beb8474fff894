"""Issue 30, session 12: what do a plan's copies cost beyond the model?

The issue's Llama (SDPA, h4096 x 8192 tokens) at budget 0.41: after the
budget's race settles, three steps are timed, interleaved, for ROUNDS rounds:
- no offloading;
- the kept plan;
- the same plan with nothing offloaded: selective-offload units become
  selective, offloaded units become kept. It has the same re-runs and no
  copies. It is over the budget, which is fine for timing.
The model predicts no stall for the kept plan (no copy it waits for), so it
predicts both plans' steps equal. Any difference is what offloading costs
that the model does not see: the copies beside compute, and the engine's hooks.

    PYTHONPATH=python python offload_cost.py [FRACTION [ROUNDS]]
"""
import statistics
import sys

import torch

import actoffload
from actoffload import _common, demo
from actoffload.budget_bench import short_plan

fraction = float(sys.argv[1]) if len(sys.argv) > 1 else 0.41
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
model = demo.build_model("llama", 4096, 8, "sdpa", 0, vocab=8192, ffn=2.75)
ids = torch.randint(0, 8192, (1, 8192), generator=torch.Generator().manual_seed(0)).cuda()


def step(ctx):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    if ctx is None:
        loss = model(input_ids=ids, labels=ids).loss
    else:
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


def timed(ctx):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    step(ctx)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


for _ in range(2):
    step(None)
ctx = actoffload.OffloadActivations(model, budget_fraction=fraction)
jb = ctx.joint_budget
while jb.measuring:
    step(ctx)
kept = jb.plan
without = ["selective" if c == "selective-offload" else "keep" if c == "offload" else c
           for c in kept["choice"]]
d2h, h2d = jb.bandwidths
no_copies = _common.ext().evaluate_joint(jb.model_units, d2h, h2d, 10 * jb._units_budget,
                                         without, True)
names = {"kept": short_plan(jb.unit_choices(kept)),
         "no copies": short_plan(jb.unit_choices(no_copies))}
print(f"kept {names['kept']} predicted {jb.predicted_step(kept) / 1e6:.1f} ms; "
      f"no copies {names['no copies']} predicted {no_copies['step_ns'] / 1e6:.1f} ms "
      f"(the units only, without the step outside them)")
times = {"no offload": [], "kept": [], "no copies": []}
for _ in range(rounds):
    times["no offload"].append(timed(None))
    jb._apply(kept)
    step(ctx)
    times["kept"].append(timed(ctx))
    jb._apply(no_copies)
    step(ctx)
    times["no copies"].append(timed(ctx))
plain = statistics.median(times["no offload"])
for name, ts in times.items():
    m = statistics.median(ts)
    q = statistics.quantiles(ts, n=4)
    print(f"{name:>10s} {names.get(name, ''):>10s}: median {m:.2f} ms (x{m / plain:.3f}), "
          f"quartiles {q[0]:.2f}-{q[2]:.2f} ms")
diff = [k - c for k, c in zip(times["kept"], times["no copies"])]
print(f"kept - no copies, per round: median {statistics.median(diff):.2f} ms, "
      f"min {min(diff):.2f}, max {max(diff):.2f}")
