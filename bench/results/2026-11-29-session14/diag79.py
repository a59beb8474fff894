"""Run 79: every door on a whole model compiled (torch.compile(model)), against the compiled model without the package."""
import sys, traceback
sys.path.insert(0, "tests")
import torch
import actoffload
import test_gpu_models as m
from actoffload.demo import te_hooks

torch.use_deterministic_algorithms(True, warn_only=True)
for name in sys.argv[1:] or ["MistralConfig", "GPT2Config"]:
    model = m.build(name, "eager")
    compiled = torch.compile(model)
    ids = torch.randint(0, m.VOCAB, (1, m.TOKENS), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    m.step(compiled, ids)
    reference, check = m.checker(compiled, ids, "eager")
    print(name, "compiled alone: loss", reference[0].item(), "peak MiB", reference[2] / 2**20, flush=True)

    def door(label, make, steps=3):
        try:
            for i in range(steps):
                got = m.step(compiled, ids, make())
                try:
                    check(got, label)
                    ok = "identical"
                except AssertionError:
                    ok = "DIFFERS loss %.6f" % got[0].item()
            print(f"  {label:22s} {ok}, peak x{got[2] / reference[2]:.3f}", flush=True)
        except Exception as e:
            print(f"  {label:22s} {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc(limit=-4, file=sys.stderr)

    door("torchtune", lambda: actoffload.OffloadActivations())
    ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=3, model_layers=4)
    door("te", lambda: te_hooks(model, ctx, sync))
    for fraction in (0.6,):
        for gran in ("layer", "block"):
            budget = actoffload.OffloadActivations(model, budget_fraction=fraction, granularity=gran)
            door(f"budget {gran} {fraction}", lambda: budget, steps=40)
            try:
                print("   plan", budget.joint_budget.unit_choices(budget.joint_budget.plan), "measuring", budget.joint_budget.measuring)
            except Exception as e:
                print("   plan?", e)
