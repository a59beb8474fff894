"""python -m actoffload.host_cost [--tensors 2000] [--repeats 7]

The host cost of the package per saved tensor, on the machine it runs on.

1. The package's own cost: one iteration of TE's front door driven the way
   autograd drives it, with `tensors` small saved tensors (256 B each) in
   layer 0 of 2 (offloaded) or kept on device, timed from the first forward
   step to the end of the backward pass: forward steps, the C++ pack hook per
   tensor, the layer's close (its D2H copies enqueued), the backward steps
   (H2D copies enqueued), the C++ unpack hook per tensor and the pass's end.
   Divided by `tensors`; the minimum over `repeats` iterations.
2. End to end, autograd included: a chain of torch.sin ops (each saves its
   input) run forward and backward with the hooks on (offloaded, kept) and
   off, interleaved, minimum over `repeats`; the difference per tensor is
   what a training loop sees, including PyTorch's own cost of calling any
   saved-tensor hook (the same for every hooks-based offloader).

Upstream TE's figure on the same kind of machine (../shared/notes/gpu.md):
~75-90 us per offloaded tensor (push + pop + steps), ~1 us per skipped one.
"""

import argparse
import time
import warnings

import torch

from . import _common, te


def _own_cost(session, tensors, repeats, offloaded, device):
    loop = _common.ext().TrainingLoop(
        session, model_layers=2, offloaded_layers=1,
        min_offload_bytes=1 if offloaded else 1 << 40)
    x = torch.randn(64, device=device, requires_grad=True)
    ys = [torch.sin(x) for _ in range(tensors)]
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        ref0, _, _ = loop.forward_step(-1)
        packed = [loop.pack(y) for y in ys]
        ref1, _, _ = loop.forward_step(-1)
        loop.backward_step(ref1, 1)
        loop.backward_step(ref0, 0)
        for p in reversed(packed):
            loop.unpack(p)
        del packed
        loop.pass_ended()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return best / tensors * 1e6


def _chain(x, layers, per_layer, ctx=None, sync=None):
    h = x
    for _ in range(layers):
        if ctx is not None:
            with ctx:
                for _ in range(per_layer):
                    h = torch.sin(h)
            h = sync(h)
        else:
            for _ in range(per_layer):
                h = torch.sin(h)
    h.sum().backward()


def measure(tensors=2000, repeats=7, backend=None, layers=4):
    """{'own_offloaded', 'own_kept', 'e2e_offloaded', 'e2e_kept' (us per
    tensor), 'plain_ms' (the chain without the package)}."""
    session = _common.new_session(backend)
    device = torch.device("cuda" if session.kind == "cuda" else "cpu")
    out = {"own_offloaded": _own_cost(session, tensors, repeats, True, device),
           "own_kept": _own_cost(session, tensors, repeats, False, device)}
    per_layer = max(1, tensors // layers)
    x = torch.randn(64, device=device, requires_grad=True)
    with warnings.catch_warnings():  # k = n - 1 warns (no overlap): wanted here
        warnings.simplefilter("ignore")
        off = te.get_cpu_offload_context(True, num_layers=layers - 1, model_layers=layers,
                                         min_offload_size=1, session=session)
        kept = te.get_cpu_offload_context(True, num_layers=layers - 1, model_layers=layers,
                                          min_offload_size=1 << 30, session=session)
        runs = {"plain": lambda: _chain(x, layers, per_layer),
                "offloaded": lambda: _chain(x, layers, per_layer, *off),
                "kept": lambda: _chain(x, layers, per_layer, *kept)}
        best = {name: float("inf") for name in runs}
        for _ in range(repeats + 1):  # interleaved: drifts hit all three
            for name, run in runs.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                run()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best[name] = min(best[name], time.perf_counter() - start)
    moved = (layers - 1) * per_layer
    out["e2e_offloaded"] = (best["offloaded"] - best["plain"]) / moved * 1e6
    out["e2e_kept"] = (best["kept"] - best["plain"]) / (layers * per_layer) * 1e6
    out["plain_ms"] = best["plain"] * 1e3
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default=None, choices=[None, "cuda", "sim"])
    args = parser.parse_args(argv)
    r = measure(args.tensors, args.repeats, backend=args.backend)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (simulated GPU)"
    print(f"# host cost per saved tensor, {where}, torch {torch.__version__}, "
          f"{args.tensors} tensors, min of {args.repeats}")
    print(f"package (steps + C++ pack/unpack + copies enqueued): "
          f"{r['own_offloaded']:.2f} us per offloaded tensor, "
          f"{r['own_kept']:.2f} us per tensor kept on device")
    print(f"end to end (autograd's hook calls included; plain chain {r['plain_ms']:.1f} ms): "
          f"{r['e2e_offloaded']:.2f} us per offloaded tensor, "
          f"{r['e2e_kept']:.2f} us per kept tensor")


if __name__ == "__main__":
    main()
