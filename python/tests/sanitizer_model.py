"""A small model trained for two steps through each front door on the GPU,
for compute-sanitizer (python/run_on_gpu.sh)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import actoffload  # noqa: E402
from models import Stack, te_forward, train_step  # noqa: E402

model = Stack(layers=4, hidden=256).cuda()
x = torch.randn(2, 256, 256, device="cuda")
ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=2, model_layers=4,
                                               min_offload_size=1024)


# Half the no-offload peak: refused or not, it runs (a refusal is raised at
# one forward, SPEC §7.8).
whole = actoffload.OffloadActivations(model, budget_fraction=0.5, min_offload_size=1024)


def budget(model, x):
    with whole:
        return model(x)


for _ in range(2):
    train_step(model, x, te_forward(ctx, sync))
for _ in range(5):
    try:
        train_step(model, x, budget)
    except ValueError as refused:  # SPEC §7.8: once, then the smallest is planned
        print("sanitizer model: refused once:", str(refused)[:120])
torch.cuda.synchronize()
print("sanitizer model: done", ctx.offloader.stats()["bytes_offloaded"],
      whole.offloader.stats()["bytes_offloaded"])
