"""Run 132: the host cost of the steady watch's read of the allocator's
out-of-memory count (MemoryProbe.ooms), once per forward after the warm-up."""
import time
import torch
from actoffload.probe import MemoryProbe

x = torch.randn(1 << 20, device="cuda")
ys = [x * i for i in range(200)]  # some allocator history
probe = MemoryProbe(torch.device("cuda"))

def per_call(f, n=2000, repeats=7):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6

print(f"MemoryProbe.ooms (memory_stats_as_nested_dict): {per_call(probe.ooms):.2f} us per call")
print(f"torch.cuda.memory_stats()['num_ooms']:          {per_call(lambda: torch.cuda.memory_stats()['num_ooms']):.2f} us per call")
print(f"torch.cuda.max_memory_allocated():             {per_call(torch.cuda.max_memory_allocated):.2f} us per call")
print(f"torch.cuda.memory_allocated():                 {per_call(torch.cuda.memory_allocated):.2f} us per call")
