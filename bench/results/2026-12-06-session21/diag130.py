"""Session 21 diagnostic: the steady-state scenario, tracing each forward's
out-of-memory handling (measured: budget_edge.after_out_of_memory and the
recorder's reading; steady: SteadyWatch and steady_out_of_memory)."""
import sys
import torch
sys.path.insert(0, "tests")
import actoffload
from actoffload import budget, budget_edge, budget_record
from test_gpu_budget import step
from test_gpu_out_of_memory import _model, _cap

MB = 1 << 20
def name(plan):
    return "".join(c[0] for c in plan["choice"]) if plan else None

orig_after = budget_edge.after_out_of_memory
def after(b):
    r = b._record
    if r is not None:
        ooms_now = b._recorder._ooms()
        print(f"   after_out_of_memory: record choice {name({'choice': r['choice']}) if r['choice'] else None} "
              f"end {r['end'] is not None} ooms at begin {r['ooms']} now {ooms_now} "
              f"raised_peak {r.get('raised_peak')} profile {r['profile']} for_one {r.get('for_one')}")
    orig_after(b)
budget_edge.after_out_of_memory = after
budget.budget_edge.after_out_of_memory = after
orig_steady = budget_edge.steady_out_of_memory
def steady(b):
    print(f"   steady_out_of_memory: plan {name(b.plan)} race {name(b._race.plan)}")
    orig_steady(b)
    print(f"     -> {name(b.plan)} settled {b._race.settled} measuring {b.measuring}")
budget_edge.steady_out_of_memory = steady
budget.budget_edge.steady_out_of_memory = steady
orig_fb = budget_edge.SteadyWatch.forward_begins
def fb(self):
    before = (self._count, self._watched, self._ended)
    got = orig_fb(self)
    print(f"   SteadyWatch.forward_begins: (count, watched, ended) {before} -> {got}")
    return got
budget_edge.SteadyWatch.forward_begins = fb

model, ids, loss, grads, _ = _model()
ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
joint = ctx.joint_budget
while joint.plan is None or joint.measuring:
    step(model, ids, ctx)
kept_peak = max(step(model, ids, ctx)[2] for _ in range(2))
room = int(0.9 * kept_peak)
print("kept", name(joint.plan), "peak", kept_peak / MB, "room", room / MB)
print("trials:", [(round(s / 1e6, 2), round(p / MB, 1), name(plan)) for s, p, plan in joint._race.all_trials])
_cap(room, torch.cuda.memory_allocated)
seen = []
model.register_forward_pre_hook(lambda m, a: seen.append((name(joint.plan), round(joint.plan["peak_bytes"] / MB, 1), joint.measuring)))
try:
    for k in range(14):
        print(f"step {k}")
        try:
            got_loss, got_grads, peak = step(model, ids, ctx)
            print(f"  ran {seen[-1]}: peak {peak/MB:.1f}")
        except torch.cuda.OutOfMemoryError as e:
            print(f"  ran {seen[-1]}: out of memory ({type(e).__name__}): {str(e)[:50]}; num_ooms {torch.cuda.memory_stats()['num_ooms']}")
        except ValueError as e:
            print(f"  refused: {e}")
finally:
    torch.cuda.set_per_process_memory_fraction(1.0)
