"""Session 23, run 142: what holds device memory after a step of a plan for
longer batches runs out of memory in its backward (run 141: memory
allocated before each step went from 568 MB to 815 MB after such a step,
and stayed, so every later step failed). Run from python/ with tests/ on
the path."""

import gc
import traceback

import torch

import actoffload
from test_gpu_budget import build, step
from test_gpu_out_of_memory import _cap


def cuda_tensors():
    out = {}
    for o in gc.get_objects():
        try:
            if torch.is_tensor(o) and o.is_cuda:
                out[id(o)] = o
        except Exception:
            pass
    return out


torch.use_deterministic_algorithms(True, warn_only=True)
model = build()
ids = torch.randint(0, 1000, (2, 1024), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
longer = torch.randint(0, 1000, (2, 1280), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
step(model, ids)
ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
joint = ctx.joint_budget
while joint.plan is None or joint.measuring:
    step(model, ids, ctx)
for _ in range(4):
    kept_peak = step(model, longer, ctx)[2]
print("kept", joint.plan["choice"], kept_peak, "allocated", torch.cuda.memory_allocated())
before = cuda_tensors()
_cap(int(0.9 * kept_peak), torch.cuda.memory_allocated)
try:
    for i in range(8):
        held = torch.cuda.memory_allocated()
        try:
            step(model, longer, ctx)
            print(i, "ran", joint.plan["choice"], "allocated before", held)
            continue
        except torch.cuda.OutOfMemoryError as e:
            where = [f"{f.name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)][-3:]
        after = torch.cuda.memory_allocated()
        gc.collect()
        collected = torch.cuda.memory_allocated()
        retired = [(loop.live_iterations()) for loop in joint._retired]
        print(i, "failed", where, "allocated before", held, "after", after,
              "after gc", collected, "live", ctx.offloader.live_iterations(), "retired", retired)
        now = cuda_tensors()
        new = sorted((t for k, t in now.items() if k not in before),
                     key=lambda t: -t.untyped_storage().nbytes())[:6]
        for t in new:
            refs = [type(r).__name__ for r in gc.get_referrers(t)][:6]
            print("   new tensor", tuple(t.shape), t.dtype, t.untyped_storage().nbytes(), refs)
finally:
    torch.cuda.set_per_process_memory_fraction(1.0)
