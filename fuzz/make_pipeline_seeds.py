#!/usr/bin/env python3
"""Writes the seed corpus of //fuzz:pipeline_fuzz_test (fuzz/pipeline_corpus/
seed-*) in the input format of fuzz/pipeline_fuzz.cc: whole iterations of
nested named groups, one stage and interleaved, with delayed offloads, caps
and faults. Run from the repository root; the output is checked in."""
import pathlib

def header(seed=1, faults=(), modules=7, fraction=4, delay=False, pool=True,
           vpp=1, cap=None):
    f = dict(faults)  # kind -> (skip, count): pinned device copy stream event record wait
    flags = modules | fraction << 3 | (64 if delay else 0) | (0 if pool else 128)
    shape = (vpp - 1) | ((0x80 | cap << 2) if cap is not None else 0)
    return bytes([seed] + [v for k in range(7) for v in f.get(k, (0, 0))] +
                 [flags, shape])

A, B, C = 0, 1, 2
def chunk(stage, mb): return [0, stage, mb]
def start(name): return [1, name]
def push(rows=8, hold=False): return [2, rows | (0x80 if hold else 0)]
def commit(name, release=False, drop=False):
    return [3, name | (4 if release else 0) | (8 if drop else 0)]
def bchunk(stage, mb): return [4, stage, mb]
def bstart(name): return [5, name]
def pop(back): return [6, back]
def bend(name): return [7, name]
FINISH, ISSUE = [8], [9]

def forward_chunk(stage, mb):
    # a { x (held, released at commit) ; b { y } ; c { z } }  nested
    return (chunk(stage, mb) + start(A) + push(8, hold=True) +
            start(B) + push(12) + commit(B) + start(C) + push(16) + commit(C) +
            commit(A, release=True, drop=True))

def backward_chunk(stage, mb, newest_back):
    # commit order B, C, A -> backward A, C, B; pushes x, y, z (z newest).
    return (bchunk(stage, mb) + bstart(A) + bstart(C) + pop(newest_back) +
            bend(C) + bstart(B) + pop(newest_back + 1) + bend(B) +
            pop(newest_back + 2) + bend(A))

def iteration(chunks):
    """chunks: forward order; backward in the engine's order (given)."""
    fwd, bwd = chunks
    out = []
    for c in fwd: out += forward_chunk(*c)
    index = {c: i for i, c in enumerate(fwd)}
    for c in bwd:
        newest_back = 3 * (len(fwd) - 1 - index[c])
        out += backward_chunk(c[0], c[1], newest_back)
    return out + FINISH

one_stage = ([(0, 0), (0, 1)], [(0, 0), (0, 1)])
interleaved = ([(0, 0), (0, 1), (1, 0), (1, 1)], [(1, 0), (1, 1), (0, 0), (0, 1)])
seeds = {
    "one_stage": header() + bytes(iteration(one_stage) * 2),
    "interleaved": header(vpp=2) + bytes(iteration(interleaved) * 2),
    "delayed_cap_fraction": header(delay=True, cap=0, fraction=2) +
        bytes(iteration(one_stage) * 2),
    "faults": header(faults={0: (3, 1), 1: (20, 2), 5: (9, 2), 6: (14, 1)},
                     pool=False) + bytes(iteration(one_stage) * 3),
    "misuse": header(modules=5) + bytes(
        bchunk(0, 0) + start(A) + chunk(3, 0) + chunk(0, 0) + push() +
        commit(B) + chunk(0, 0) + FINISH + [11, 0x80] + pop(0) + ISSUE +
        iteration(one_stage)),
}
out = pathlib.Path("fuzz/pipeline_corpus")
out.mkdir(exist_ok=True)
for name, data in seeds.items():
    (out / f"seed-{name}").write_bytes(data)
    print(name, len(data))
