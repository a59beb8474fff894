"""What the budget's CPU tests share (test_joint_budget.py,
test_budget_loops.py): a scripted memory probe (CPU tensors have no
allocator counters), a small decoder named as Hugging Face names its
blocks, and a budget made with both."""

import contextlib
import warnings

import torch
import torch.utils.checkpoint
import torch.nn.functional as F

import actoffload
from actoffload import _common
from models import assert_identical, train_step


class ScriptedProbe:
    """A device whose allocator the test scripts. Each unit's forward leaves
    `unit_bytes` allocated until its backward has run; while the units'
    backward runs, the step holds `outside` bytes more (a transient). Once
    planned, a peak reads what the plan predicts, plus `over`. A unit run
    selectively (recompute.py) leaves `selective_bytes` (default: as many)
    until its backward. With `per_recompute`, a planned peak reads instead
    what the profiled units predict for the plan, plus that many bytes per
    unit recomputed in full (what the model leaves out: JointRace::FitExcess),
    plus `over`. With `capacity`, a step whose peak would pass it raises
    torch.cuda.OutOfMemoryError where `out_of_memory` says ("forward": as
    the last unit's forward ends; "backward": as the units' backward
    begins; "first backward": as the first unit's backward ends, where
    its input's gradient comes: a reload for it, say), counted in ooms(); the peak then reads the capacity until it is reset
    (and what is allocated never reads more),
    and what the step held is let go, as when the exception drops its graph;
    room() is then what is left of it (budget_windows.py). With
    `recompute_bytes`, a unit whose forward ran recomputed in full leaves
    that many (else as many as kept). With `caller_holds`, such a unit's
    forward also returns that many bytes that its caller lets go only after
    the next unit's forward (or as the backward begins: Hugging Face's eager attention returns its
    weights, which the layer drops at its end, after its MLP; kept, the
    unit saves them, and they count in its own bytes).
    """

    def __init__(self, unit_bytes, outside, glue=0, selective_bytes=None):
        self.unit_bytes = unit_bytes
        self.selective_bytes = unit_bytes if selective_bytes is None else selective_bytes
        self.outside = outside
        self.glue = glue   # left allocated between two units' forwards
        self.glued = 0
        self.over = 0
        self.per_recompute = None
        self.now = 0       # allocated
        self.top = 0       # the peak since the last reset
        self.held = []     # (unit, bytes) allocated until its backward, forward order
        self.in_backward = False
        self.ctx = None    # the OffloadActivations whose plan the device follows
        self.capacity = None
        self.out_of_memory = "backward"
        self.raised = 0    # out-of-memory errors
        self.reached = None  # the peak since an out-of-memory error
        self.recompute_bytes = None
        self.caller_holds = 0
        self.returned = []  # (the unit at whose forward's start they go, bytes)
        self.ran = []  # per forward, how each unit's forward ran (None: kept)

    def room(self):
        return None if self.capacity is None else self.capacity - self.allocated()

    def ooms(self):
        return self.raised

    def _check_capacity(self, where):
        if self.capacity is None or where != self.out_of_memory:
            return
        if where in ("backward", "first backward"):
            self.in_backward = True  # the peak as it would be in the backward
        reached, self.reached = self.reached, None  # (what this step would reach)
        peak = self.peak()
        self.in_backward, self.reached = False, reached
        if peak > self.capacity:
            self.raised += 1
            self.reached = self.capacity  # the peak reads what it held
            self._let_go()
            raise torch.cuda.OutOfMemoryError(
                f"scripted: {peak} bytes asked of a device of {self.capacity}")

    def watch(self, units):
        self.units = len(units)
        for index, unit in enumerate(units):
            unit.register_forward_hook(self._forward_ended(index))
            if index > 0:
                unit.register_forward_pre_hook(self._glue(index))

    def _glue(self, index):
        def hook(module, args):
            if not torch.is_grad_enabled() or _common.in_backward():
                return
            self.now -= sum(b for at, b in self.returned if at <= index)
            self.returned = [(at, b) for at, b in self.returned if at > index]
            self.now += self.glue
            self.glued += self.glue
            self.top = max(self.top, self.now)
        return hook

    def _forward_ended(self, index):
        def hook(module, args, output):
            if not torch.is_grad_enabled() or _common.in_backward():
                return  # a recompute's re-run: its bytes are the backward's
            ran = getattr(module.__dict__.get("forward"), "checkpointed", None)
            if index == 0 or not self.ran:  # (a forward whose first unit ran without grad)
                self.ran.append([None] * self.units)
            self.ran[-1][index] = ran
            left = (self.selective_bytes if ran in ("selective", "selective-offload")
                    else self.recompute_bytes if ran == "recompute" and
                    self.recompute_bytes is not None else self.unit_bytes)
            self.now += left
            self.held.append((index, left))
            if ran == "recompute" and self.caller_holds:
                self.now += self.caller_holds
                self.returned.append((index + 2, self.caller_holds))
            self.top = max(self.top, self.now)
            tensor = _common.first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(lambda grad: self._backward_begins(index))
            if index == self.units - 1:
                self._check_capacity("forward")
            if index == 0 and self.out_of_memory == "first backward":
                first = _common.first_grad_tensor(args)
                if first is not None:
                    first.register_hook(lambda grad: self._check_capacity("first backward"))
        return hook

    def _backward_begins(self, index):
        if not self.in_backward:
            self.now -= sum(b for _, b in self.returned)  # the model's forward has returned
            self.returned = []
            self._check_capacity("backward")
        while self.held and self.held[-1][0] > index:  # their backward has run
            self.now -= self.held.pop()[1]
        if not self.in_backward:
            self.in_backward = True
            # Queued from a callback, so that it runs after every callback
            # queued during the backward (the budget reads the step's end).
            queue = torch.autograd.Variable._execution_engine.queue_callback
            queue(lambda: queue(self._step_ended))

    def _step_ended(self):
        self.in_backward = False
        self._let_go()

    def _let_go(self):
        """What the step held is let go (its end, or an error that drops its graph)."""
        self.now -= (sum(left for _, left in self.held) + self.glued
                     + sum(b for _, b in self.returned))
        self.held, self.glued, self.returned = [], 0, []

    def allocated(self):
        return self.now if self.capacity is None else min(self.now, self.capacity)

    def peak(self):
        if self.reached is not None:
            return self.reached
        joint = self.ctx.joint_budget if self.ctx is not None else None
        if joint is not None and joint.plan is not None and self.per_recompute is not None:
            d2h, h2d = joint.bandwidths
            profiled = _common.ext().evaluate_joint(
                joint.profile["units"], d2h, h2d, 1 << 40, list(joint.plan["choice"]), True)
            return (profiled["peak_bytes"] + self.over
                    + self.per_recompute * joint.plan["choice"].count("recompute"))
        if joint is not None and joint.plan is not None:
            return joint.plan["peak_bytes"] + self.over
        return max(self.top, self.now) + (self.outside if self.in_backward else 0) + self.over

    def reset_peak(self):
        self.top = self.now
        self.reached = None


class Attention(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
        return self.out(F.dropout(attn, 0.1, self.training) @ v)


class Mlp(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.down(F.dropout(F.gelu(self.up(x)), 0.1, self.training))


class Layer(torch.nn.Module):
    """A decoder layer as Hugging Face names its blocks."""

    def __init__(self, hidden):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.self_attn = Attention(hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return (x + self.mlp(self.norm2(x)),)  # a tuple, as Hugging Face's


class Decoder(torch.nn.Module):
    def __init__(self, layers=4, hidden=64):
        super().__init__()
        self.embed = torch.nn.Linear(hidden, hidden)
        self.layers = torch.nn.ModuleList(Layer(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)[0]
        return self.head(x)


class CheckpointedDecoder(Decoder):
    """Each layer's call inside a checkpoint, as Hugging Face's gradient
    checkpointing wraps it: non-reentrant, unless a subclass says
    otherwise."""
    use_reentrant = False

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=self.use_reentrant)[0]
        return self.head(x)


def _more_work(a, b):
    """Whether choice `a` does more work than `b` (another choice, each
    unit's at least b's: keep < offload, keep < selective < recompute,
    selective < selective-offload)."""
    return a != b and all(x == y or y == "keep" or (y, x) in (
        ("selective", "recompute"), ("selective", "selective-offload"))
        for x, y in zip(a, b))


def kept_trial(trials, budget):
    """The trial the race keeps among (step, peak, plan) trials: the
    fastest within `budget` of those whose plan does no more work than
    another's within it, but one that offloads only where it is more than
    1% faster than the fastest such that does not
    (JointRaceOptions::offload_tie)."""
    def fastest(fits):
        least = [t for t in fits
                 if not any(_more_work(t[2]["choice"], u[2]["choice"]) for u in fits)]
        return min(least, key=lambda t: t[0])
    fits = [t for t in trials if t[1] <= budget]
    best = fastest(fits)
    def copies(t):
        return any(c in ("offload", "selective-offload") for c in t[2]["choice"])
    plain = [t for t in fits if not copies(t)]
    if copies(best) and plain:
        simplest = fastest(plain)
        if best[0] >= simplest[0] * (1 - 0.01):
            return simplest
    return best


def forced_plan(budget, choices):
    """The budget's plan with unit u's choice choices[u] where given (once
    its warm-up is over, the plan it runs): an offloaded unit released as
    the next unit begins and reloaded as its own backward begins."""
    def place_after(unit):
        return budget._index[unit + 1] if unit + 1 < len(budget._index) else len(budget.plan["choice"]) - 1
    plan = {key: list(value) if isinstance(value, list) else value
            for key, value in budget.plan.items()}
    for unit, choice in choices.items():
        place = budget._index[unit]
        plan["choice"][place] = choice
        plan["released_during"][place] = place_after(unit)
        plan["reloaded_during"][place] = place
    return plan


def seeded_step(model, x, ctx=None, inner=None):
    """One step, inside `ctx` where given, and inside `inner()` (a caller's
    own context) within it where given."""
    torch.manual_seed(7)  # the same dropout masks in every step

    def forward(model, x):
        with ctx, (inner() if inner is not None else contextlib.nullcontext()):
            return model(x)
    return train_step(model, x, None if ctx is None else forward)


def skipping(model, x, ctx, steps):
    """`steps` seeded steps of `x`, each skipped where the device runs out
    of memory (as a trainer's loop that catches
    torch.cuda.OutOfMemoryError does): what each gave (None where
    skipped), the budget's plan in force at each forward (None before
    one), and the warnings' messages."""
    joint = ctx.joint_budget
    ran = []
    handle = model.register_forward_pre_hook(lambda module, args: ran.append(joint.plan))
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            try:
                results.append(seeded_step(model, x, ctx))
            except torch.cuda.OutOfMemoryError:
                results.append(None)
    handle.remove()
    return results, ran, [str(w.message) for w in caught]


def profile(model, x, ctx, reference=None):
    """Runs the budget's profile iterations (budget.py: all kept; where the
    torch version has selective checkpoint, selective; where recompute is
    allowed, recomputed), each bit-identical to `reference` when given;
    returns how many ran."""
    count = 0
    while ctx.joint_budget.plan is None:
        got = seeded_step(model, x, ctx)
        count += 1
        if reference is not None:
            assert_identical(reference, got)
        assert count <= 3, "planned after three profile iterations at most"
    return count


UNIT = 1 << 20  # the scripted bytes each unit leaves allocated

# A kept profile record of three units, by hand (budget_record.py's fields):
# bytes above the step's start, host clock (ns). Each unit's forward leaves
# 100, but the code after unit 1 frees 20 of it before unit 2 begins (a
# Hugging Face layer's input, which the layer does not save, goes when the
# model's loop moves on); forwards of 90, backward stretches of 200, the
# head 110.
KEPT_RECORD = {"base": 0, "before": [10, 110, 190], "after": [110, 210, 290],
               "input": [5, 5, 5], "fwd": [0, 100, 200], "fwd_end": [90, 190, 290],
               "bwd": [800, 600, 400], "end": 1000, "forward_peak": [130, 230, 310],
               "backward_peak": [150, 240, 330], "head_peak": 330,
               "bwd_allocated": [150, 200, 290], "peak": 330}


def make(model, budget_fraction, outside=UNIT, selective_bytes=None, **kwargs):
    probe = ScriptedProbe(UNIT, outside=outside, selective_bytes=selective_bytes)
    ctx = actoffload.OffloadActivations(
        model, budget_fraction=budget_fraction, probe=probe, backend="sim",
        min_offload_size=1024, **kwargs)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    return ctx, probe


class _CompiledCall:
    """torch >= 2's Module.__call__, for torch 1.13 (which ignores
    `_compiled_call_impl`): the compiled call where one is set."""

    def __call__(self, *args, **kwargs):
        call = self.__dict__.get("_compiled_call_impl")
        return (call if call is not None else self._call_impl)(*args, **kwargs)


_compiled_classes = {}


def compile_layers(model):
    """Each of model.layers compiled (compile_module)."""
    for layer in model.layers:
        compile_module(layer)


def compile_module(module):
    """`module` compiled: by dynamo without inductor on torch >= 2, or, on
    torch 1.13, given what compile() leaves on a module and a class whose
    __call__ runs it as torch >= 2's Module.__call__ does."""
    if hasattr(module, "compile"):  # torch >= 2: dynamo, without inductor
        module.compile(backend="eager")
    else:  # what compile() leaves on a module, and how torch >= 2 calls it
        module.__class__ = _compiled_classes.setdefault(
            type(module), type(type(module).__name__, (_CompiledCall, type(module)), {}))
        module._compiled_call_impl = module._call_impl
