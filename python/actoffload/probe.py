"""What the budget measures (budget.py): the caching allocator's counters,
timestamps on the compute stream, and the pinned copy bandwidths."""

import time

import torch


class MemoryProbe:
    """The caching allocator's own counters for one CUDA device.
    `granularity`: the block it rounds large tensors to (2 MiB), the step
    in which its peak moves; a measured peak that far above a budget fits
    it (JointRaceOptions::tolerance_bytes). A probe without one is exact."""

    granularity = 2 << 20

    def __init__(self, device=None):
        self.device = device

    def allocated(self):
        return torch.cuda.memory_allocated(self.device)

    def peak(self):
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def room(self):
        """How many more bytes the allocator can hand out: what the device
        has free and what the allocator holds unused, within the process's
        limit (torch.cuda.set_per_process_memory_fraction). (A probe
        without this method, or returning None: not known; the budget's
        profile then runs every unit kept, budget_windows.py.)"""
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        limit = total * (fraction(self.device) if fraction is not None else 1.0)
        return int(min(free + reserved, limit)) - self.allocated()

    def ooms(self):
        """How many out-of-memory errors the allocator has raised (read at
        each forward after the warm-up: the nested statistics, which
        memory_stats() flattens at some cost). (A probe without this
        method: none are looked for.)"""
        return torch.cuda.memory_stats_as_nested_dict(self.device).get("num_ooms", 0)


class Clock:
    """Timestamps on the current CUDA stream (events), or the host's clock."""

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def ns(self, start, end):
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) * 1e6
        return float(end - start)


def copy_bandwidths(device=None, nbytes=64 << 20):
    """Pinned copy bandwidths (d2h, h2d) in GB/s, measured once."""
    device_buffer = torch.empty(nbytes, dtype=torch.uint8, device=device or "cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    result = []
    for direction in ("d2h", "h2d"):
        for attempt in range(2):  # the first warms the path
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            if direction == "d2h":
                host.copy_(device_buffer, non_blocking=True)
            else:
                device_buffer.copy_(host, non_blocking=True)
            end.record()
            end.synchronize()
        result.append(nbytes / (start.elapsed_time(end) * 1e6))
    return tuple(result)


def default_probe(layers, probe):
    """The caller's probe, or the allocator's counters of the layers'
    CUDA device; None on CPU (then the budget needs a probe)."""
    if probe is not None:
        return probe
    for layer in layers:
        for parameter in layer.parameters():
            if parameter.is_cuda:
                return MemoryProbe(parameter.device)
    return None
