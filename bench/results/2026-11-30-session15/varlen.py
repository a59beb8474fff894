"""torchtune's usage, OffloadActivations() around the whole forward, on batches
of varying length (dynamic padding): per step, the peak above the memory
before the step (torch.cuda.max_memory_allocated) and the step time, against
the same step without the package, interleaved; the loss compared bit for bit.

    PYTHONPATH=python python bench/results/2026-11-30-session15/varlen.py [hidden] [lengths]
"""
import sys
import time
import warnings

import torch

import actoffload
from actoffload.demo import build_model

hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else
                            "4096,3072,4608,2048,4096,3584,4608,2560").split(",")]
model = build_model("llama", hidden, 8, "sdpa", 0, vocab=8192)
ctx = actoffload.OffloadActivations()
gen = torch.Generator().manual_seed(0)


def step(ids, use):
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if use:
        with ctx:
            out = model(input_ids=ids, labels=ids)
    else:
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.cuda.synchronize()
    return out.loss.item(), torch.cuda.max_memory_allocated() - base, time.perf_counter() - start


def batch(n):
    return torch.randint(0, 8192, (1, n), generator=gen).cuda()


step(batch(lengths[0]), False)  # warm-up of kernels
print(f"hidden {hidden}, 8 layers, SDPA, bf16; lengths {lengths}")
print("step  len   plain MiB  ours MiB  mem x   plain ms  ours ms  step x  loss equal  warnings")
for i, n in enumerate(lengths * 2):
    ids = batch(n)
    state = torch.cuda.get_rng_state()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_rng_state(state)
        loss_p, mem_p, t_p = step(ids, False)
        torch.cuda.set_rng_state(state)
        loss_o, mem_o, t_o = step(ids, True)
    said = [str(w.message)[:60] for w in seen if "actoffload" in str(w.message)]
    print(f"{i:4d} {n:5d} {mem_p / 2**20:10.0f} {mem_o / 2**20:9.0f} {mem_o / mem_p:6.3f} "
          f"{t_p * 1e3:9.1f} {t_o * 1e3:8.1f} {t_o / t_p:7.3f}  {loss_p == loss_o!s:10}  {len(said)} {said[:1]}")
