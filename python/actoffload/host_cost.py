"""python -m actoffload.host_cost [--tensors 2000] [--layers 4] [--repeats 7]

The host cost of the package per saved tensor, hooks included: a chain of
`layers` layers of tiny ops, each saving one small tensor for backward
(torch.sin saves its input), run forward and backward through TE's front
door, once with every tensor offloaded (layers 0 .. n-2, k = n - 1) and once
with every tensor kept (min_offload_size above their size: the C++ pack hook
keeps them), beside the same loop without the package. The ops are so small
that the host is the bottleneck, so the wall time of a step (synchronized at
its end) above the plain loop's, divided by the tensors, is what the package
adds per tensor on the host: pack + unpack + the layer steps, Python hooks,
C++ engine and the copies' enqueueing. Median of `repeats` steps.

Upstream TE's figure on the same kind of machine (../shared/notes/gpu.md):
~75-90 us per offloaded tensor, ~1 us per skipped one.
"""

import argparse
import statistics
import time
import warnings

import torch

from . import te


def _step(x, layers, per_layer, ctx=None, sync=None):
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


def _time(run, device, repeats):
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def measure(tensors=2000, layers=4, repeats=7, elements=64, backend=None):
    """(plain s, offloaded us/tensor, kept us/tensor, offloaded tensors)."""
    device = torch.device("cuda" if (backend or ("cuda" if torch.cuda.is_available()
                                                 else "sim")) == "cuda" else "cpu")
    per_layer = max(1, tensors // layers)
    x = torch.randn(elements, device=device, requires_grad=True)
    plain = _time(lambda: _step(x, layers, per_layer), device, repeats)
    with warnings.catch_warnings():  # k = n - 1 warns (no overlap): wanted here
        warnings.simplefilter("ignore")
        ctx, sync = te.get_cpu_offload_context(
            True, num_layers=layers - 1, model_layers=layers, min_offload_size=1,
            backend=backend)
        kctx, ksync = te.get_cpu_offload_context(
            True, num_layers=layers - 1, model_layers=layers,
            min_offload_size=elements + 1, backend=backend)
    offloaded = _time(lambda: _step(x, layers, per_layer, ctx, sync), device, repeats)
    stats = ctx.offloader.stats()
    moved = stats["tensors_offloaded"] // (repeats + 1)
    kept = _time(lambda: _step(x, layers, per_layer, kctx, ksync), device, repeats)
    total = per_layer * layers
    return (plain, (offloaded - plain) / max(moved, 1) * 1e6,
            (kept - plain) / total * 1e6, moved)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default=None, choices=[None, "cuda", "sim"])
    args = parser.parse_args(argv)
    plain, off_us, kept_us, moved = measure(args.tensors, args.layers, args.repeats,
                                            backend=args.backend)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (simulated GPU)"
    print(f"# host cost per saved tensor, {where}, torch {torch.__version__}")
    print(f"plain loop: {plain * 1e3:.2f} ms per step of {args.tensors} saved tensors")
    print(f"offloaded: {off_us:.2f} us per offloaded tensor ({moved} per step)")
    print(f"kept: {kept_us:.2f} us per tensor kept on device")


if __name__ == "__main__":
    main()
