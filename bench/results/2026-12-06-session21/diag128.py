"""Session 21 diagnostic: the steady-state test of test_gpu_out_of_memory.py,
step by step: what each step held, which plan ran, what an out-of-memory
error left allocated, and the retired engine loops."""
import sys
import torch
sys.path.insert(0, "tests")
import actoffload
from test_gpu_budget import step
from test_gpu_out_of_memory import _model, _cap

MB = 1 << 20
model, ids, loss, grads, _ = _model()
ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
joint = ctx.joint_budget
while joint.plan is None or joint.measuring:
    step(model, ids, ctx)
kept_peak = max(step(model, ids, ctx)[2] for _ in range(2))
kept = tuple(joint.plan["choice"])
room = int(0.9 * kept_peak)
print("kept", kept, "peak", kept_peak / MB, "room", room / MB)
print("trials:", [(round(s / 1e6, 2), round(p / MB, 1), "".join(c[0] for c in plan["choice"])) for s, p, plan in joint._race.all_trials])
torch.cuda.synchronize()
print("allocated at the cap", torch.cuda.memory_allocated() / MB, "reserved", torch.cuda.memory_reserved() / MB)
_cap(room, torch.cuda.memory_allocated)
def state(tag):
    torch.cuda.synchronize()
    print(f"  {tag}: allocated {torch.cuda.memory_allocated()/MB:.1f} reserved {torch.cuda.memory_reserved()/MB:.1f} "
          f"retired {[l.live_iterations() for l in joint._retired]} offloader live {ctx.offloader.live_iterations() if hasattr(ctx.offloader, 'live_iterations') else None}")
seen = []
model.register_forward_pre_hook(lambda m, a: seen.append(("".join(c[0] for c in joint.plan["choice"]), round(joint.plan["peak_bytes"] / MB, 1))))
try:
    for k in range(14):
        choice = "(before the forward)"
        try:
            got_loss, got_grads, peak = step(model, ids, ctx)
            ok = torch.equal(loss, got_loss) and all(torch.equal(a, b) for a, b in zip(grads, got_grads))
            print(f"step {k} plan {seen[-1]}: peak {peak/MB:.1f} MB identical {ok} predicted {joint.plan['peak_bytes']/MB:.1f}")
        except torch.cuda.OutOfMemoryError as e:
            print(f"step {k} plan {seen[-1]}: out of memory: {str(e)[:60]}")
        state("after")
finally:
    torch.cuda.set_per_process_memory_fraction(1.0)
