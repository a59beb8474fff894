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


def init(deterministic=True):
    """Joins the process group (NCCL, one GPU per local rank); returns
    (rank, world size, device). deterministic=False: kernels without a
    deterministic variant warn instead of raising."""
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
    torch.use_deterministic_algorithms(True, warn_only=not deterministic)
    return dist.get_rank(), dist.get_world_size(), device


def timed(step):
    """One call of step() (a training step returning the loss or None):
    (seconds, the slowest rank's; peak bytes above the allocation before
    it; the loss)."""
    dist.barrier()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    loss = step()
    torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], device="cuda")
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item(), torch.cuda.max_memory_allocated() - base, loss


def interleaved(systems, grads, rounds, warmup=2):
    """Times each system's step (label -> step(); the first is no
    offloading) interleaved: every round runs one step of each, in order,
    so a drift of the machine's speed falls on all alike. Per label: the
    median over rounds of its step over that round's first step ("ratio")
    and their interquartile range ("spread"), its median step ("time"), its
    peak, and its last round's loss and grads() (taken right after its
    step)."""
    for step in systems.values():
        for _ in range(warmup):
            step()
    out = {label: {"times": [], "ratios": [], "peak": 0} for label in systems}
    for round_ in range(rounds):
        first = None
        for label, step in systems.items():
            seconds, peak, loss = timed(step)
            first = seconds if first is None else first
            r = out[label]
            r["times"].append(seconds)
            r["ratios"].append(seconds / first)
            r["peak"] = max(r["peak"], peak)
            if round_ == rounds - 1:
                r["loss"] = None if loss is None else loss.detach().float().clone()
                r["grads"] = grads()
    for r in out.values():
        ratios = sorted(r["ratios"])
        r["time"] = statistics.median(r.pop("times"))
        r["ratio"] = statistics.median(ratios)
        r["spread"] = ratios[(3 * len(ratios)) // 4] - ratios[len(ratios) // 4]
    return out


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
    """One rank's row: step (the interleaved median ratio, and its spread)
    and peak as ratios to no offloading."""
    return {"system": label, "rank": dist.get_rank(),
            "step_ms": result["time"] * 1e3, "step_x": result["ratio"],
            "spread": result["spread"],
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
    head = ["system", "rank", "step ms", "step ×", "IQR", "peak MiB", "peak ×",
            "bit-identical"]
    head += [c for c in columns]
    print(f"\n## {title}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    systems = list(dict.fromkeys(r["system"] for r in gathered))
    for system in systems:
        for r in sorted((r for r in gathered if r["system"] == system), key=lambda r: r["rank"]):
            cells = [r["system"], str(r["rank"]), f"{r['step_ms']:.1f}", f"{r['step_x']:.3f}",
                     f"{r['spread']:.3f}", f"{r['peak_mib']:.0f}", f"{r['peak_x']:.3f}", r["identical"]]
            cells += [str(r.get(c, "")) for c in columns]
            print("| " + " | ".join(cells) + " |")
    return gathered


AGAIN = "no offload (again)"


def exit_unless_identical(gathered):
    """Rank 0 (the one with the gathered rows) exits with status 1 if any
    row is not bit-identical to no offloading, unless no offloading itself
    is not (its second run, AGAIN, differs: a model without deterministic
    kernels, whose rows are then read against that spread)."""
    if gathered is None:
        return
    if any(r["system"] == AGAIN and r["identical"] != "yes" for r in gathered):
        print("\nno offloading differs from itself run to run: the rows are within its "
              "spread or not, as the table shows; not checked bit for bit")
        return
    bad = [f"{r['system']} (rank {r['rank']}): {r['identical']}"
           for r in gathered if r["identical"] != "yes"]
    if bad:
        raise SystemExit("not bit-identical to no offloading: " + "; ".join(bad))
