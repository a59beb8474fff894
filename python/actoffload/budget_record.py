"""What the budget (budget.py) measures of one iteration while it profiles
and races: a record (a dict, which budget_profile.make_profile reads) per
forward, filled at its units' boundaries and at its backward's.

Per unit: the bytes allocated before and after its forward, its input's
bytes, CUDA-event (or host clock) marks at its forward's start and end and
at its backward's start; for the iteration, its start and end marks, its
peak above the forward's start and the allocator's count of
out-of-memory errors at its start. A profile iteration ("profile": no
plan yet) also reads the allocator's peak per stretch of the step (the
peak counter is read and reset at each boundary): each unit's forward,
the head (from the last unit's forward's end to the units' backward) and
each unit's backward. A unit is seen not to be re-runnable where its
forward modified an input or one of its buffers in place, or took an
inference tensor (JointBudget._recomputable says why each matters).
"""

import torch

from . import _common
from .probe import Clock, MemoryProbe


class Recorder:
    """Fills the records of a budget's measured iterations, reading `probe`
    (a MemoryProbe, or a test's scripted one) and a Clock."""

    def __init__(self, probe):
        self.probe = probe
        self.clock = Clock(isinstance(probe, MemoryProbe))

    def begin(self, units, profile):
        """A measured forward begins: its record, with the allocator's peak
        counter reset. `profile`: whether it is a profile iteration."""
        self.probe.reset_peak()
        n = len(units)
        return {"start": self.clock.mark(), "ooms": self._ooms(),
                "base": self.probe.allocated(), "before": [0] * n, "after": [0] * n,
                "input": [0] * n, "fwd": [None] * n, "fwd_end": [None] * n,
                "bwd": [None] * n, "end": None, "peak": None, "versions": [None] * n,
                "buffers": [None] * n, "profile": profile,
                "top": 0, "forward_peak": [0] * n, "head_peak": 0,
                "bwd_allocated": [None] * n, "backward_peak": [0] * n, "last_bwd": None}

    def _stretch_peak(self, r):
        """In the profile: the peak (above the forward's start) since the
        last boundary, and the counter reset for the next stretch."""
        if not r["profile"]:
            return 0
        top = self.probe.peak() - r["base"]
        self.probe.reset_peak()
        r["top"] = max(r["top"], top)
        return top

    def unit_begins(self, r, index, unit, args, kwargs):
        """Unit `index` (the module `unit`) begins its forward; returns
        False where an argument is an inference tensor (not re-runnable).
        (Inference tensors have no version counter, and cannot be modified
        outside inference mode; but no checkpoint can save one.)"""
        self._stretch_peak(r)
        r["before"][index] = self.probe.allocated()
        tensor = _common.first_tensor(args, kwargs)
        r["input"][index] = _common.tensor_bytes(tensor) if tensor is not None else 0
        r["fwd"][index] = self.clock.mark()
        tensors = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
        r["versions"][index] = [(t, t._version) for t in tensors if not t.is_inference()]
        r["buffers"][index] = _buffer_versions(unit)
        return not any(t.is_inference() for t in tensors)

    def unit_ends(self, r, index, unit, output, backward_begins):
        """Unit `index` ended its forward with `output`; `backward_begins(r,
        index)` is called when its backward begins (a hook on the output's
        first tensor that needs a gradient). Returns False where the
        forward modified an argument or a buffer in place (not re-runnable)."""
        rerunnable = not (any(t._version != v for t, v in r["versions"][index])
                          or _buffers_changed(r["buffers"][index], unit))
        r["versions"][index] = r["buffers"][index] = None
        r["fwd_end"][index] = self.clock.mark()
        r["after"][index] = self.probe.allocated()
        r["forward_peak"][index] = self._stretch_peak(r)
        tensor = _common.first_grad_tensor(output)
        if tensor is not None:
            tensor.register_hook(_BackwardBegins(backward_begins, r, index))
        return rerunnable

    def backward_begins(self, r, index):
        """Unit `index`'s backward begins; returns whether it is the
        iteration's first unit to (its pass's end is then to be awaited)."""
        r["bwd"][index] = self.clock.mark()
        if r["profile"]:
            top = self._stretch_peak(r)
            if r["last_bwd"] is None:
                r["head_peak"] = top
            else:
                r["backward_peak"][r["last_bwd"]] = top
            r["last_bwd"] = index
        if r["profile"] or r["ooms"] is not None:
            r["bwd_allocated"][index] = self.probe.allocated() - r["base"]
        first = not r.get("queued")
        r["queued"] = True
        return first

    def pass_ends(self, r):
        """The iteration's backward ended: its end mark and peak."""
        r["end"] = self.clock.mark()
        if r["profile"]:
            top = self._stretch_peak(r)
            if r["last_bwd"] is not None:
                r["backward_peak"][r["last_bwd"]] = top
            r["peak"] = r["top"]
        else:
            r["peak"] = self.probe.peak() - r["base"]
        return r["peak"]

    def _ooms(self):
        ooms = getattr(self.probe, "ooms", None)
        return None if ooms is None else ooms()

    def forward_raised(self, r):
        """`r`'s forward raised: the allocator's peak then, above the
        forward's start (an out-of-memory error's is what the step held
        when it failed; the caller may reset the counter before the next
        forward); the arguments it holds let go."""
        r["raised_peak"] = max(r["top"], self.probe.peak() - r["base"])
        # A unit that raised holds its arguments here (unit_ends never ran):
        # through them, the failed forward's graph and all it saved would
        # live until the next forward (run 114: 370 MiB after an
        # out-of-memory error, which the retried step could not use).
        r["versions"] = [None] * len(r["versions"])
        r["buffers"] = [None] * len(r["buffers"])

    def out_of_memory(self, r):
        """Where `r`'s iteration ran out of device memory (its pass did not
        end, and the allocator raised an out-of-memory error since it
        began): the most it was seen to hold above the forward's start,
        less than it needed; else None. For an error in the forward, that
        is the allocator's peak as the forward raised (forward_raised). In
        the backward, nothing of ours runs after the error: the allocator's
        peak read now, but at least the most allocated at the iteration's
        unit boundaries (a loop may reset the peak before each step; the
        forward's end holds everything it saved)."""
        if r["end"] is not None or r["ooms"] is None or self._ooms() <= r["ooms"]:
            return None
        if "raised_peak" in r:
            return r["raised_peak"]
        seen = [a - r["base"] for a in r["before"] + r["after"] if a] + [
            a for a in r["bwd_allocated"] if a is not None]
        return max([r["top"], self.probe.peak() - r["base"]] + seen)

    def step_ns(self, r):
        """The iteration's step, forward's start to backward's end, in ns."""
        return self.clock.ns(r["start"], r["end"])


class _BackwardBegins:
    __slots__ = ("call", "record", "index")

    def __init__(self, call, record, index):
        self.call, self.record, self.index = call, record, index

    def __call__(self, grad):
        self.call(self.record, self.index)


def _buffer_versions(unit):
    """(name, buffer, version) of each of `unit`'s buffers (an inference
    tensor has no version, and cannot be changed outside inference mode)."""
    return [(name, b, b._version) for name, b in unit.named_buffers()
            if not b.is_inference()]


def _buffers_changed(before, unit):
    """Whether `unit`'s forward changed or replaced a buffer since
    `before` (_buffer_versions): BatchNorm's running statistics in training."""
    now = _buffer_versions(unit)
    return len(now) != len(before) or any(
        n0 != n1 or b0 is not b1 or v0 != v1
        for (n0, b0, v0), (n1, b1, v1) in zip(before, now))
