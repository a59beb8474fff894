"""Session 12: would a fluid release close the joint plan's gap to its limit?

A Python port of the engine's model (engine/plan/joint_model.cc,
EvaluateJoint), replayed on a bench dump (profiles-*.json). It has one
option, --fluid: a unit that must make room frees only the bytes needed at
that point, waits only for that prefix of its copy, and keeps the rest on
device. The rest can be freed later if a later unit needs room, or in full
at the forward's end if the backward does. With --late, a unit freed
because the backward needs room goes as the first backward slot that
overflows without it begins, its copy waited for there, not at the
forward's end. --search tries every choice the units allow and prints the
five fastest.

    python3 fluid_replay.py DUMP [--fluid] [--late] [--search | PLAN ...]

PLAN is a letter per unit (K keep, O offload, R recompute, S selective,
Q selective-offload), e.g. QQQSSRSKK. Without --fluid the port predicts
what _C.evaluate_joint does (checked against it on run 45's trials).
Prediction = the returned step plus the dump's outside_ns.
"""
import itertools
import json
import sys

LETTERS = {"K": "keep", "O": "offload", "R": "recompute", "S": "selective",
           "Q": "selective-offload"}


def selective(c):
    return c in ("selective", "selective-offload")


def host_bytes(u, c):
    if c == "selective-offload":
        return max(0, u["selective_bytes"] - u["input_bytes"])
    return u["saved_bytes"]


def forward_bytes(u, c):
    if c == "recompute":
        return u["input_bytes"]
    return u["selective_bytes"] if selective(c) else u["saved_bytes"]


def recreated(u, c):
    if c == "recompute":
        return u["recompute_bytes"]
    return u["saved_bytes"] - u["selective_bytes"] if selective(c) else 0


def forward_transient(u, c):
    if c == "recompute":
        return max(u["forward_transient_bytes"], u["recompute_forward_transient_bytes"])
    if selective(c):
        return max(u["forward_transient_bytes"], u["selective_forward_transient_bytes"])
    return u["forward_transient_bytes"]


def backward_transient(u, c):
    if c == "keep":
        return u["backward_transient_bytes"]
    most = max(u["backward_transient_bytes"], u["forward_transient_bytes"])
    return max(most, u["selective_backward_transient_bytes"]) if selective(c) else most


def rerun_ns(u, c):
    if c == "recompute":
        return u["recompute_ns"]
    return u["selective_ns"] if selective(c) else 0


def evaluate(units, d2h, h2d, budget, choice, fluid=False, late=False):
    """(step ns, stall ns, plan) of `choice`, or None if it does not fit;
    plan as the engine's model returns it: a unit the rules free is
    offloaded (O, or Q if selective), one they leave is kept (K, or S)."""
    n = len(units)
    rerun = [c if c in ("recompute", "selective", "selective-offload") else "keep"
             for c in choice]
    need = [forward_bytes(units[i], rerun[i]) for i in range(n)]
    host = [host_bytes(units[i], rerun[i]) for i in range(n)]

    def releasable(j):
        return rerun[j] in ("keep", "selective-offload") and units[j]["offloadable"]

    sent = [0] * n                     # bytes of each unit freed (sent to host)
    waits = [[] for _ in range(n)]     # per unit: (other unit, fraction of forward, its bytes out)
    resident = 0
    for i in range(n):                 # forward, memory
        own = need[i] + forward_transient(units[i], rerun[i])
        while resident + own > budget:
            open_units = [j for j in range(i) if releasable(j) and sent[j] < host[j]
                          and (fluid or sent[j] == 0)]
            if not open_units:
                break
            j = open_units[0]
            at = min(max(0, budget - resident) / own, 1.0)  # where the room is needed
            amount = host[j] - sent[j]
            if fluid:
                amount = min(amount, resident + own - budget)
            sent[j] += amount
            resident -= amount
            waits[i].append((j, at, sent[j]))
        if resident + own > budget:
            return None
        resident += need[i]

    late_slot = [0] * n  # the backward slot from which a unit's sent bytes are gone

    def place_backward():
        """(mem, extra, reload slot) per slot; else the first slot that
        overflows (-1: a reload finds no room)."""
        mem, extra, slot = [0] * n, [0] * n, [-1] * n
        for i in range(n):
            for s in range(n - i):
                mem[s] += need[i] - (sent[i] if s >= late_slot[i] else 0)
            mem[n - 1 - i] += recreated(units[i], rerun[i])
            extra[n - 1 - i] = backward_transient(units[i], rerun[i])
        over = [s for s in range(n) if mem[s] + extra[s] > budget]
        if over:
            return over[0]
        first = 0
        for u in reversed(range(n)):
            if not sent[u]:
                continue
            fits = [s for s in range(max(first, late_slot[u] + 1 if late_slot[u] else 0), n - u)
                    if max(mem[t] + extra[t] for t in range(s, n - u)) + sent[u] <= budget]
            if not fits:
                return -1
            slot[u] = first = fits[0]
            for s in range(first, n - u):
                mem[s] += sent[u]
        return mem, extra, slot

    placed = place_backward()
    while not isinstance(placed, tuple):  # the backward needs more room
        rest = [j for j in range(n - 1) if releasable(j) and sent[j] < host[j]]
        if not rest:
            return None
        j = rest[0]
        if late and not sent[j] and 0 <= placed < n - 1 - j:
            # Freed as the backward slot that overflows begins, its copy
            # waited for there, not at the forward's end.
            late_slot[j] = placed
        else:
            waits[n - 1].append((j, 1.0, host[j]))
        sent[j] = host[j]
        placed = place_backward()
    _, _, slot = placed

    # Forward, time: a unit's copy starts at its forward (after the copies
    # before it) and ends no sooner than its forward; a prefix of it is out
    # no sooner than it was produced.
    t = stall = d2h_free = 0.0
    start, copy_start, done = [0.0] * n, [0.0] * n, [0.0] * n

    def out_by(j, nbytes):
        if nbytes >= sent[j]:
            return done[j]
        produced = start[j] + units[j]["forward_ns"] * nbytes / host[j]
        return max(copy_start[j] + nbytes / d2h, produced)

    for i in range(n):
        start[i], forward, behind = t, units[i]["forward_ns"], 0.0  # fraction run
        for j, at, nbytes in waits[i]:
            reach = t + (at - behind) * forward
            ready = out_by(j, nbytes)
            stall += max(0.0, ready - reach)
            t, behind = max(ready, reach), at
        t += (1.0 - behind) * forward
        if sent[i]:
            copy_start[i] = max(d2h_free, start[i])
            d2h_free = done[i] = max(copy_start[i] + sent[i] / d2h, t)
    # Backward, time.
    h2d_free, back = t, [0.0] * n
    for s in range(n):
        for v in range(n):
            if sent[v] and late_slot[v] == s and s > 0 and done[v] > t:
                stall += done[v] - t
                t = done[v]
        for v in reversed(range(n)):
            if slot[v] == s:
                h2d_free = max(h2d_free, t, done[v]) + sent[v] / h2d
                back[v] = h2d_free
        u = n - 1 - s
        if sent[u] and back[u] > t:
            stall += back[u] - t
            t = back[u]
        t += units[u]["backward_ns"] + rerun_ns(units[u], rerun[u])
    letter = {v: k for k, v in LETTERS.items()}
    plan = "".join(("Q" if rerun[i] == "selective-offload" else "O") if sent[i]
                   else "S" if rerun[i] == "selective-offload" else letter[rerun[i]]
                   for i in range(n))
    return t, stall, plan


def main(argv):
    dump = json.load(open(argv[0]))[0]
    fluid, late = "--fluid" in argv, "--late" in argv
    units, (d2h, h2d), budget = dump["units"], dump["bandwidths"], dump["units_budget"]
    outside = dump["outside_ns"]
    if "--search" in argv:
        options = []
        for u in units:
            allowed = "K" + "O" * u["offloadable"] + "R" * u["recomputable"]
            allowed += ("S" + "Q" * u["offloadable"]) * bool(u.get("selective"))
            options.append(allowed)
        found = {}
        for plan in itertools.product(*options):
            got = evaluate(units, d2h, h2d, budget, [LETTERS[c] for c in plan], fluid, late)
            if got is not None:
                found[got[2]] = got
        results = sorted(found.values())[:5]
    else:
        results = [evaluate(units, d2h, h2d, budget, [LETTERS[c] for c in p], fluid, late) or p
                   for p in argv[1:] if not p.startswith("--")]
    for got in results:
        print(f"{got}: does not fit" if isinstance(got, str) else
              f"{got[2]}: {(got[0] + outside) / 1e6:.2f} ms predicted, stalls {got[1] / 1e6:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
