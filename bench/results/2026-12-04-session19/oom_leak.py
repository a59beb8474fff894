"""After a caught torch.cuda.OutOfMemoryError, is the failed step's memory
given back, and when (without the package; with a budget's race plan)?
Usage: PYTHONPATH=python python bench/results/2026-12-04-session19/oom_leak.py"""
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../python/tests"))
import actoffload  # noqa: E402
from test_gpu_budget import build, step  # noqa: E402

MiB = 1 << 20


def cap(room):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + room) / total)


def failed_step(model, ids, ctx, label):
    for p in model.parameters():
        p.grad = None
    a0 = torch.cuda.memory_allocated()
    where = "none"
    try:
        step(model, ids, ctx)
    except torch.cuda.OutOfMemoryError as e:
        where = "backward" if "backward" in "".join(
            str(f) for f in __import__("traceback").extract_tb(e.__traceback__)) else "forward"
        del e
    a1 = torch.cuda.memory_allocated()
    gc.collect()
    a2 = torch.cuda.memory_allocated()
    record = None if ctx is None else ctx.joint_budget._record
    held = 0 if record is None else sum(
        t.untyped_storage().nbytes() for v in record["versions"] if v for t, _ in v)
    print(f"{label}: OOM in {where}; allocated before {a0 / MiB:.0f} MiB, after the "
          f"except {a1 / MiB:.0f}, after gc.collect() {a2 / MiB:.0f}; the record holds "
          f"{held / MiB:.0f} MiB of arguments", flush=True)


torch.use_deterministic_algorithms(True, warn_only=True)
model = build()
ids = torch.randint(0, 1000, (2, 1024), device="cuda")
step(model, ids)
_, _, peak = step(model, ids)
print(f"no-offload peak {peak / MiB:.0f} MiB", flush=True)
cap(int(0.5 * peak))
failed_step(model, ids, None, "plain model, room 0.5")
torch.cuda.set_per_process_memory_fraction(1.0)
ctx = actoffload.OffloadActivations(model, budget_fraction=0.9)
while ctx.joint_budget.plan is None:
    step(model, ids, ctx)
cap(int(0.6 * peak))
for k in range(4):
    failed_step(model, ids, ctx, f"budget 0.9, room 0.6, step {k} ({ctx.joint_budget.plan['choice']})")
torch.cuda.set_per_process_memory_fraction(1.0)
