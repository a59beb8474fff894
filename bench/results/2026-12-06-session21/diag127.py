"""Session 21 diagnostic: the block stitch anomaly (who frees bytes between
a window's last unit's end and the next unit's begin?) and whether steps
leave GPU memory in reference cycles (freed only by gc.collect)."""
import gc, sys
import torch
sys.path.insert(0, "tests")
import actoffload
from actoffload import budget, budget_profile
from actoffload.probe import MemoryProbe
from test_gpu_budget import build, step
from test_gpu_out_of_memory import _model, _cap

MB = 1 << 20
log = []
state = {"unit": None, "phase": None}

def on_gc(phase, info):
    if info.get("generation") is None:
        return
    a = torch.cuda.memory_allocated()
    log.append((phase, info["generation"], info.get("collected"), state["phase"], state["unit"], a))
gc.callbacks.append(on_gc)

JB = budget.JointBudget
orig_b, orig_e = JB.unit_begins, JB.unit_ends
def ub(self, index, args, kwargs):
    state["unit"], state["phase"] = index, "begin"
    log.append(("unit_begins", index, self._forwards.checkpoints(index), type(self.units[index].__dict__.get("forward")).__name__, None, torch.cuda.memory_allocated()))
    return orig_b(self, index, args, kwargs)
def ue(self, index, output):
    state["unit"], state["phase"] = index, "end"
    log.append(("unit_ends", index, self._forwards.checkpoints(index), None, None, torch.cuda.memory_allocated()))
    return orig_e(self, index, output)
JB.unit_begins, JB.unit_ends = ub, ue

raw = []
orig_stitch = budget_profile.stitch
def stitch(records, ran, kind, clock):
    raw.append((kind, [dict(r) for r in records], [list(h) for h in ran]))
    return orig_stitch(records, ran, kind, clock)
budget_profile.stitch = stitch

def show(r, how):
    base = r["base"]
    n = len(r["before"])
    print(" ran:", "".join(h[0].upper() for h in how))
    for i in range(n):
        gap = (r["before"][i + 1] - r["after"][i]) / MB if i + 1 < n else 0
        print(f"  u{i:2d} {how[i]:9s} before {(r['before'][i]-base)/MB:8.1f} after {(r['after'][i]-base)/MB:8.1f} "
              f"left {(r['after'][i]-r['before'][i])/MB:7.1f} gap {gap:7.1f} fpeak {(r['forward_peak'][i])/MB:8.1f}")

model, ids, loss, grads, plain_peak = _model(False)
whole = actoffload.OffloadActivations(model, budget_fraction=0.5, granularity="block")
while whole.joint_budget.plan is None:
    step(model, ids, whole)
room = int(0.7 * plain_peak)
_cap(room, torch.cuda.memory_allocated)
ctx = actoffload.OffloadActivations(model, budget_bytes=int(0.45 * plain_peak), granularity="block")
joint = ctx.joint_budget
log.clear()
it = 0
marks = []
while joint.plan is None:
    marks.append(len(log))
    step(model, ids, ctx)
    it += 1
print("profile iterations", it)
for kind, records, ran in raw:
    print("KIND", kind)
    for r, how in zip(records, ran):
        show(r, how)
# the log around each window's end: print all gc events with context, and unit events with big drops
print("GC events during the profile (phase, gen, collected, at, unit, allocated MB):")
for e in log:
    if e[0] in ("start", "stop"):
        print("  ", e[:5], round(e[5] / MB, 1))
print("unit events where allocated dropped by > 4 MB since the previous event:")
prev = None
for e in log:
    if prev is not None and e[5] < prev[5] - 4 * MB:
        print("  ", prev[:4], round(prev[5] / MB, 1), "->", e[:4], round(e[5] / MB, 1))
    prev = e
# cycles: steps then gc.collect
torch.cuda.set_per_process_memory_fraction(1.0)
for name, c in (("no ctx", None), ("joint", ctx)):
    for k in range(4):
        try:
            step(model, ids, c)
        except torch.cuda.OutOfMemoryError:
            print("oom"); continue
        torch.cuda.synchronize()
        a = torch.cuda.memory_allocated()
        n = gc.collect()
        torch.cuda.synchronize()
        print(f"{name} step {k}: gc.collect() collected {n} objects, allocated {a/MB:.1f} -> {torch.cuda.memory_allocated()/MB:.1f} MB; measuring {joint.measuring}")
