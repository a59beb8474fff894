"""Issue 30, session 13: OPT with SDPA (test_gpu_models.py's size), the budget
per layer at 0.6: each step's peak through the warm-up and after, with the
lean steady state (budget.LEAN) and without. Run 60 measured the kept plan
7% over the budget after the warm-up.

    PYTHONPATH=python:python/tests python opt_peak.py [NAME] [ATTENTION]
"""
import sys

import torch

import actoffload
from actoffload import budget
import test_gpu_models as t

# Where the race's window ends: each pass's end as the race sees it (its
# queued callback) against the user's (after backward), in MB above the
# forward's start.
ends = []
marks = []
_pass_ended = budget.JointBudget._pass_ended


def _trace():
    snapshot = torch.cuda.memory._snapshot()
    return [e for t in snapshot["device_traces"] for e in t]


def pass_ended(self, record):
    torch.cuda.synchronize()
    marks.append(len(_trace()))
    ends.append((torch.cuda.max_memory_allocated() / 1e6, record["base"] / 1e6,
                 torch.cuda.memory_allocated() / 1e6))
    _pass_ended(self, record)


budget.JointBudget._pass_ended = pass_ended
name = sys.argv[1] if len(sys.argv) > 1 else "OPTConfig"
attention = sys.argv[2] if len(sys.argv) > 2 else "sdpa"
for lean in (True,):
    budget.LEAN = lean
    model = t.build(name, attention)
    ids = torch.randint(0, t.VOCAB, (1, t.TOKENS), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    t.step(model, ids)
    peak0 = t.step(model, ids)[2]
    ctx = actoffload.OffloadActivations(model, budget_bytes=int(0.6 * peak0))
    jb = ctx.joint_budget
    rows = []
    for i in range(40):
        measuring = jb.measuring
        try:
            p = t.step(model, ids, ctx)[2]
        except ValueError as e:
            rows.append(f"{i}: refused {str(e)[:60]}")
            continue
        plan = "".join(c[0].upper() for c in jb.unit_choices(jb.plan)) if jb.plan else "-"
        if i == 8:
            for e in _trace()[marks[-1]:]:
                if e["action"] in ("alloc", "free_requested"):
                    frames = [f["name"][:90] for f in e.get("frames", [])
                              if "at::native" in f["name"] or "autograd" in f["name"]
                              or "Engine" in f["name"] or "python" in f["name"].lower()][:8]
                    rows.append(f"\n    after the race's end: {e['action']} {e['size']} "
                                f"{frames}")
        if i == 7:
            # C++ stacks: gathering Python's broke the checkpoint's early stop
            # (an exception pending inside its recompute).
            torch.cuda.memory._record_memory_history(max_entries=200000, stacks="cpp")
        if i in (7, 8) and ends:
            rows.append(f"[at the race's end: max {ends[-1][0]:.2f} MB, its base {ends[-1][1]:.2f}, "
                        f"allocated {ends[-1][2]:.2f}; the user's: max "
                        f"{torch.cuda.max_memory_allocated() / 1e6:.2f}, peak {p / 1e6:.2f}, "
                        f"allocated {torch.cuda.memory_allocated() / 1e6:.2f}]")
        rows.append(f"{i}:{'m' if measuring else 's'} {plan} "
                    f"{p / peak0:.3f}")
    print(f"LEAN={lean}: no offload {peak0} B, budget {jb.budget_bytes / peak0:.3f}")
    print("  " + ", ".join(rows))
    print("  " + ctx.budget_plan().replace("\n", "\n  "))
    print("  the race's peaks:", [p / peak0 for p in jb.peaks])
    print("  its trials:", [(round(s / 1e6, 2), round(p / peak0, 3),
                             "".join(c[0].upper() for c in jb.unit_choices(q)))
                            for s, p, q in jb._all_trials])
    print("  budget", jb.budget_bytes, "race budget", jb._race.budget, "units budget",
          jb._units_budget, "outside", jb.profile["outside"])
    del model, ctx
    torch.cuda.empty_cache()
