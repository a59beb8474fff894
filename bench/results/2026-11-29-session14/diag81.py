"""Run 81: a model compiled whole: what reaches the package (pushes, units begun, warnings)."""
import sys, warnings
sys.path.insert(0, "tests")
import torch, torch._dynamo.utils
import actoffload
from actoffload import _common
import test_gpu_models as m

model = m.build("MistralConfig", "eager")
whole = torch.compile(model)
ids = torch.randint(0, m.VOCAB, (1, m.TOKENS), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
m.step(whole, ids)
print("compiled_anything", _common.compiled_anything(), dict(torch._dynamo.utils.counters["stats"]))
print("graph breaks", dict(torch._dynamo.utils.counters["graph_break"]))
ctx = actoffload.OffloadActivations()
for i in range(2):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = _common.pushes(ctx.offloader)
        m.step(whole, ids, ctx)
    st = ctx.offloader.stats()
    print("torchtune step", i, "pushes", _common.pushes(ctx.offloader) - before, "stats", st, [str(w.message)[:150] for w in seen])
ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
began = []
for u in ctx._units:
    u.register_forward_pre_hook(lambda mod, args: began.append(type(mod).__name__))
for i in range(3):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m.step(whole, ids, ctx)
    print("budget step", i, "units began (own hooks)", began, "flag", ctx._units_began, [str(w.message)[:150] for w in seen])
    began.clear()
