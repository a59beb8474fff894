"""Run 71: compiled layers, each way of recomputing them, loss and gradients against each other."""
import functools, sys
sys.path.insert(0, "tests")
import torch
import actoffload
import test_gpu_models as m
from budget_testing import forced_plan

torch.use_deterministic_algorithms(True, warn_only=True)
for name in ["GPT2Config", "GPTNeoXConfig"]:
    model = m.build(name, "eager")
    layers = actoffload.find_layers(model)
    for layer in layers:
        layer.compile()
    ids = torch.randint(0, m.VOCAB, (1, m.TOKENS), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    got = {}
    m.step(model, ids); got["plain"] = m.step(model, ids); got["plain again"] = m.step(model, ids)
    for layer in layers[:3]:
        layer.forward = functools.partial(torch.utils.checkpoint.checkpoint, type(layer).forward.__get__(layer), use_reentrant=False)
    m.step(model, ids); got["inside"] = m.step(model, ids)
    for layer in layers[:3]:
        del layer.forward
    got["plain after"] = m.step(model, ids)
    try:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.step(model, ids); got["hf outside"] = m.step(model, ids)
        model.gradient_checkpointing_disable()
    except Exception as e:
        print("hf gc:", type(e).__name__, str(e)[:200])
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.9)
    joint = ctx.joint_budget
    for _ in range(60):
        try:
            m.step(model, ids, ctx)
        except ValueError:
            continue
        if not joint.measuring and joint.refusal is None:
            break
    print(name, "kept plan", ctx.budget_plan() if hasattr(ctx, "budget_plan") else None)
    got["ours kept plan"] = m.step(model, ids, ctx)
    joint._apply(forced_plan(joint, {0: "keep", 1: "keep", 2: "keep"}))
    m.step(model, ids, ctx); got["ours keep"] = m.step(model, ids, ctx)
    joint._apply(forced_plan(joint, {0: "recompute", 1: "recompute", 2: "recompute"}))
    m.step(model, ids, ctx); got["ours R"] = m.step(model, ids, ctx)
    got["ours R again"] = m.step(model, ids, ctx)
    ref = got["plain"]
    for k, v in got.items():
        print(f"{name:14s} {k:16s} loss {v[0].item():.6f} peak {v[2]/2**20:8.1f} MiB  "
              f"grad diff vs plain {max((a.float()-b.float()).abs().max().item() for a,b in zip(ref[1], v[1])):.3g} "
              f"vs inside {max((a.float()-b.float()).abs().max().item() for a,b in zip(got['inside'][1], v[1])):.3g}")
