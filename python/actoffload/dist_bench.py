"""What the distributed benchmarks share (fsdp_bench.py, pipeline_bench.py):
one process per GPU started by torchrun, NCCL with NVLink multicast off,
deterministic algorithms, a step timed and its peak measured on every rank,
the comparison with the same run without offloading, and one table of every
rank's rows printed by rank 0."""

import os
import statistics
import time

import torch
import torch.distributed as dist

# The GPU machines' rule, in every process (the launcher should set them
# too: torchrun's own processes read them before this module runs).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def init():
    """Joins the process group (NCCL, one GPU per local rank); returns
    (rank, world size, device)."""
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs one CUDA GPU per process (torchrun "
                         "--nproc_per_node 2)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.use_deterministic_algorithms(True)
    return dist.get_rank(), dist.get_world_size(), device


def measure(step, steps, warmup=2):
    """Runs `warmup` then `steps` calls of step() (each one training step,
    returning the loss or None); returns the median step (s) with the
    ranks' slowest per step, the peak (max_memory_allocated above the
    allocation before each step) and the last loss."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times, peak, loss = [], 0, None
    for _ in range(steps):
        dist.barrier()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - t0], device="cuda")
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
    return {"time": statistics.median(times), "peak": peak,
            "loss": None if loss is None else loss.detach().float().clone()}


def local_grads(model):
    """Every parameter's gradient on this rank (a DTensor's local shard)."""
    grads = []
    for p in model.parameters():
        g = p.grad
        if g is not None and hasattr(g, "to_local"):
            g = g.to_local()
        grads.append(None if g is None else g.detach().clone())
    return grads


def identical(reference, result):
    """'yes' when the loss and every gradient are bit-identical, else what
    differs."""
    if (reference["loss"] is None) != (result["loss"] is None) or (
            reference["loss"] is not None and not torch.equal(reference["loss"], result["loss"])):
        return "loss differs"
    diff = 0.0
    for a, b in zip(reference["grads"], result["grads"]):
        if (a is None) != (b is None):
            return "a gradient is missing"
        if a is not None and not torch.equal(a, b):
            diff = max(diff, (a.float() - b.float()).abs().max().item())
    return "yes" if diff == 0 else f"max|dgrad| {diff:.2g}"


def row(label, reference, result, **extra):
    """One rank's row: step and peak as ratios to no offloading."""
    return {"system": label, "rank": dist.get_rank(),
            "step_ms": result["time"] * 1e3, "step_x": result["time"] / reference["time"],
            "peak_mib": result["peak"] / 2**20,
            "peak_x": result["peak"] / max(1, reference["peak"]),
            "identical": identical(reference, result), **extra}


def print_table(title, rows, columns=()):
    """Gathers every rank's rows; rank 0 prints them as one markdown table
    (rank by rank within each system). Returns the gathered rows on rank 0,
    None elsewhere."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    if dist.get_rank() != 0:
        return None
    gathered = [r for ranks in everyone for r in ranks]
    head = ["system", "rank", "step ms", "step ×", "peak MiB", "peak ×", "bit-identical"]
    head += [c for c in columns]
    print(f"\n## {title}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    systems = list(dict.fromkeys(r["system"] for r in gathered))
    for system in systems:
        for r in sorted((r for r in gathered if r["system"] == system), key=lambda r: r["rank"]):
            cells = [r["system"], str(r["rank"]), f"{r['step_ms']:.1f}", f"{r['step_x']:.3f}",
                     f"{r['peak_mib']:.0f}", f"{r['peak_x']:.3f}", r["identical"]]
            cells += [str(r.get(c, "")) for c in columns]
            print("| " + " | ".join(cells) + " |")
    return gathered
