"""Session 23, run 143: the set-up of test_gpu_out_of_memory.py's longer-batch
test, its skipping loop printing, after each failed step, what is allocated
(before and after gc.collect()) and the device tensors Python can see that
were not there before the cap, with who refers to them (run 141: 568 MB
allocated before a step became 815 MB after one failed in its backward)."""

import gc
import traceback

import torch

import actoffload
from test_gpu_budget import step
from test_gpu_out_of_memory import _cap, _model


def cuda_tensors():
    out = {}
    for o in gc.get_objects():
        try:
            if torch.is_tensor(o) and o.is_cuda:
                out[id(o)] = o
        except Exception:
            pass
    return out


model, ids, _, _, _ = _model()
ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
joint = ctx.joint_budget
while joint.plan is None or joint.measuring:
    step(model, ids, ctx)
longer = torch.randint(0, 1000, (2, 1280), device="cuda",
                       generator=torch.Generator("cuda").manual_seed(1))
want = step(model, longer)[:2]
step(model, longer, ctx)
kept_peak = max(step(model, longer, ctx)[2] for _ in range(2))
print("kept", joint.plan["choice"], kept_peak, "allocated", torch.cuda.memory_allocated())
gc.collect()
before = cuda_tensors()
_cap(int(0.9 * kept_peak), torch.cuda.memory_allocated)
try:
    for i in range(10):
        held = torch.cuda.memory_allocated()
        plan = tuple(joint.plan["choice"])
        try:
            step(model, longer, ctx)
            print(i, "ran", plan, "allocated before", held)
            continue
        except torch.cuda.OutOfMemoryError as e:
            where = [f"{f.name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)][-3:]
        after = torch.cuda.memory_allocated()
        grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters()
                    if p.grad is not None)
        gc.collect()
        print(i, "failed", plan, where, "allocated before", held, "after", after,
              "after gc", torch.cuda.memory_allocated(), "grads", grads,
              "live", ctx.offloader.live_iterations(),
              "retired", [loop.live_iterations() for loop in joint._retired],
              "stats", ctx.offloader.stats())
        now = cuda_tensors()
        new = sorted((t for k, t in now.items() if k not in before),
                     key=lambda t: -t.untyped_storage().nbytes())[:5]
        for t in new:
            refs = [type(r).__name__ for r in gc.get_referrers(t)][:5]
            print("   new tensor", tuple(t.shape), t.dtype, t.untyped_storage().nbytes(), refs)
finally:
    torch.cuda.set_per_process_memory_fraction(1.0)
