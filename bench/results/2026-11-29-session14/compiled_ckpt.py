"""Per-layer checkpointing of compiled layers, two ways, in one process:
the checkpoint around each layer's compiled call (outside the compiled code,
as Hugging Face's gradient checkpointing and now the budget put it) or
inside it (each layer's forward wrapped before dynamo traces it, as the
budget did until session 14). Step time (median over interleaved rounds,
with its interquartile range), peak above the memory before the forward,
and the loss; dynamo's graph count before and after the timed rounds.

    PYTHONPATH=python python compiled_ckpt.py [hidden] [k ...]
"""
import functools
import statistics
import sys
import time

import torch
import torch.utils.checkpoint
import torch._dynamo.utils

from actoffload import demo

hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
ks = [int(k) for k in sys.argv[2:]] or [4, 7]
model = demo.build_model("llama", hidden, 8, "sdpa", 0)
layers = demo.decoder_layers(model)
for layer in layers:
    layer.compile()
ids = torch.randint(0, 32000, (1, 4096), device="cuda", generator=torch.Generator("cuda").manual_seed(0))


own_calls = [layer._compiled_call_impl for layer in layers]
# Made once: dynamo guards on the forward it traced (a new object each round
# would recompile).
inside = [functools.partial(torch.utils.checkpoint.checkpoint,
                            type(layer).forward.__get__(layer), use_reentrant=False)
          for layer in layers]
outside = [functools.partial(torch.utils.checkpoint.checkpoint, own, use_reentrant=False)
           for own in own_calls]


def wrap(way, k):
    for i, layer in enumerate(layers):
        layer.__dict__.pop("forward", None)
        layer._compiled_call_impl = own_calls[i]
        if i < k and way == "inside":
            layer.forward = inside[i]
        elif i < k and way == "outside":
            layer._compiled_call_impl = outside[i]


def step():
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() - base, loss.item()


modes = [("none", 0)] + [(way, k) for k in ks for way in ("inside", "outside")]
for way, k in modes:  # compile every variant
    wrap(way, k)
    for _ in range(3):
        step()
graphs = dict(torch._dynamo.utils.counters["stats"])
times = {m: [] for m in modes}
result = {}
for _ in range(15):
    for m in modes:
        wrap(*m)
        t, peak, loss = step()
        times[m].append(t)
        result[m] = (peak, loss)
base = statistics.median(times[("none", 0)])
print(f"llama h{hidden}, 8 layers, 4096 tokens, sdpa, each layer compiled; {torch.cuda.get_device_name()}; "
      f"no checkpoint {base * 1e3:.1f} ms, {result[('none', 0)][0] / 2**20:.0f} MiB")
for m in modes:
    q = statistics.quantiles(times[m], n=4)
    print(f"{m[0]:8s} k={m[1]}  step x{statistics.median(times[m]) / base:.3f} (IQR {q[0] / base:.3f}-{q[2] / base:.3f})"
          f"  mem x{result[m][0] / result[('none', 0)][0]:.3f}  loss {result[m][1]:.6f}")
print("dynamo stats after compiling:", graphs, "after timing:", dict(torch._dynamo.utils.counters["stats"]))
