#!/usr/bin/env python3
"""Writes the seed corpus (fuzz/corpus/seed-*) in the input format of
fuzz_program.h: whole iterations under each schedule, faults, composites,
views, stale handles. Run from the repository root; the output is checked in."""
import pathlib

def header(seed=0, faults=()):
    f = dict(faults)  # kind -> (skip, count); kinds: pinned device copy stream event record wait
    return bytes([seed] + [v for k in range(7) for v in f.get(k, (0, 0))])

def create(layers, k=1, flags=0, min_idx=3, cov_idx=0, table=None, budget=None):
    """budget: a byte b asking for activation_budget_bytes = 1 + 4096 b
    (top flag bits 0xC0, SPEC 4.7)."""
    flags |= 8 if table else 0
    if budget is not None:
        flags = (flags & 0x1F) | 0xC0
    out = [0, flags, layers - 1, k + 1, min_idx, cov_idx]
    if table:  # {layer: (release_byte, reload_byte)}
        out.append(sum(1 << l for l in table))
        for l in sorted(table):
            out += list(table[l])
    if budget is not None:
        out.append(budget)
    return out

FWD, FIN, DESTROY = [2], [4], [1]
def bwd(l): return [3, l]
def tensor(kind=0, rows=16, cols=16, dtype=0, extra=0, hold=False, ready=False, flags=0):
    return [kind | (8 if hold else 0) | (16 if ready else 0) | flags, rows - 1, cols - 1, dtype | extra << 3]
def push(**kw): return [5] + tensor(**kw)
def composite(parts, metadata=b""):
    present = sum(1 << i for i, p in enumerate(parts) if p)
    out = [6, (len(parts) - 1) | present << 2 | len(metadata) << 5] + list(metadata)
    for p in parts:
        if p: out += tensor(**p)
    return out
def pop(back): return [7, back]
def popc(back): return [8, back]
def manual(call, l): return [{"offload": 9, "release": 10, "reload": 11}[call], l]
def run_for(us): return [13, us]

def iteration(layers, per_layer):
    """Forward pushes `per_layer` (a list of op lists) in each layer, then the
    backward pops them newest first."""
    ops = []
    for _ in range(layers):
        ops += FWD
        for p in per_layer: ops += p
    n = len(per_layer)
    for l in reversed(range(layers)):
        ops += bwd(l)
        for i in range(n):
            popper = popc if per_layer[n - 1 - i][0] == 6 else pop
            ops += popper((layers - 1 - l) * n + i)
    return ops + FIN

plain = [push(), push(kind=1, extra=1, rows=32), push(kind=4)]
views = [push(hold=True, rows=32), push(kind=2, extra=8), push(kind=6),
         push(kind=7), push(kind=3, dtype=1), push(kind=5, flags=64)]
comps = [composite([dict(dtype=3), None, dict(kind=4, dtype=2)], b"fp8"), push(ready=True)]

seeds = {
    "default_k2_of_4": header() + bytes(create(4, 2) + iteration(4, plain) * 2),
    "views_retained": header(1) + bytes(create(3, 1, flags=2) + iteration(3, views) * 2),
    "composites_skip_sparse": header(2) + bytes(create(3, 1, flags=4, cov_idx=3) + iteration(3, comps + plain)),
    "table": header(3) + bytes(create(4, table={0: (1, 2), 1: (0, 0), 2: (0, 0)}) + iteration(4, plain) * 2),
    "manual": header(4) + bytes(create(3, flags=1) + FWD + push() + manual("offload", 0) + FWD + push(kind=1)
        + manual("offload", 1) + FWD + push() + manual("release", 0) + manual("release", 1) + run_for(50)
        + bwd(2) + pop(0) + manual("reload", 1) + bwd(1) + pop(1) + manual("reload", 0) + bwd(0) + pop(2) + FIN),
    "manual_offload_stream": header(5) + bytes(create(2, flags=1 | 16) + FWD + push() + manual("offload", 0)
        + manual("release", 0) + FWD + push() + manual("reload", 0) + bwd(1) + pop(0) + bwd(0) + pop(1) + FIN),
    "faults": header(6, {0: (2, 1), 1: (5, 2), 2: (3, 1), 4: (7, 1), 5: (9, 1), 6: (11, 1)})
        + bytes(create(4, 2) + iteration(4, plain) * 2),
    "byte_budget": header(8) + bytes(create(4, budget=2) + iteration(4, plain) * 3),
    "byte_budget_views_faults": header(9, {1: (9, 1), 2: (6, 1), 6: (14, 1)})
        + bytes(create(3, budget=3) + iteration(3, views + comps) * 3),
    "stale_handles": header(7) + bytes(create(2, 1) + iteration(2, plain) + pop(0) + FWD + push()
        + DESTROY + create(2, 0) + FWD + push() + pop(1) + pop(0) + popc(0) + pop(9)
        + bwd(7) + bwd(255) + manual("offload", 0) + create(2, 1, flags=0xE0) + FWD + push() + pop(0) + FIN),
}
out = pathlib.Path("fuzz/corpus")
for name, data in seeds.items():
    (out / f"seed-{name}").write_bytes(data)
