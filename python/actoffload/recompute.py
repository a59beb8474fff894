"""The forwards of the units a budget recomputes (budget.py): a wrapper
that runs a unit under torch.utils.checkpoint where its budget's plan says
so, and the unit's own forward elsewhere. A unit is recomputed whole
("recompute": only its input is saved) or selectively ("selective", where
the torch version has selective-checkpoint policies: the outputs of its
costly ops, matmuls and attention, are saved beside its input, and only the
cheap ops between them, norms, activation functions, softmax, residual
sums, and the matmuls that are cheap for the bytes they make, attention
scores, run again before its backward). A selective unit may also be
offloaded ("selective-offload"): the outputs it saves go to host through
the budget's engine loop and come back before its re-run."""

import copy
import functools
import math

import torch
import torch.utils._pytree
import torch.utils.checkpoint

from . import _common

# The costly ops whose outputs a selective unit saves (aten names; those the
# torch version lacks are left out): what Megatron's selective recompute and
# torchtitan's op-level policy keep.
_SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm",
              "convolution", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu",
              "_flash_attention_forward", "_efficient_attention_forward")


@functools.lru_cache(maxsize=1)
def selective_available():
    """Whether this torch has selective-checkpoint policies (torch >= 2.4)
    whose saved outputs can be read again by a second backward (see
    _selective_contexts)."""
    if not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"):
        return False
    forward, _ = torch.utils.checkpoint.create_selective_checkpoint_contexts(_policy)
    storage = getattr(forward, "storage", None)
    return getattr(storage, "default_factory", None) is list


@functools.lru_cache(maxsize=1)
def _saved_packets():
    return frozenset(getattr(torch.ops.aten, name) for name in _SAVED_OPS
                     if hasattr(torch.ops.aten, name))


# A matmul whose output is more than this many times the elements of its
# two operands together is run again rather than saved. Such an output is
# cheap for its bytes: each element sums K products, and K is under a
# quarter of the output's shorter side. Eager attention's scores (query
# times key: heads x tokens^2 elements, summing over the head dimension)
# are the one such matmul of a transformer layer, its largest tensor;
# Megatron's selective recompute re-runs them too. A linear layer's output
# is about the size of its input and weight together at most (an MLP's
# up-projection: 1.2 times), and stays saved.
_CHEAP_MATMUL = 4

# The matmuls, by aten name, and the argument holding their left operand.
_MATMUL_LEFT = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1}


@functools.lru_cache(maxsize=1)
def _matmul_packets():
    return {getattr(torch.ops.aten, name): left for name, left in _MATMUL_LEFT.items()}


def _saves(op, args, kwargs=None):
    """Whether the selective policy saves `op`'s output (see above)."""
    packet = getattr(op, "_overloadpacket", op)
    if packet not in _saved_packets() or _draws_random(op, args, kwargs or {}):
        return False
    left = _matmul_packets().get(packet)
    if left is None:
        return True
    a, b = args[left], args[left + 1]
    out = math.prod(a.shape[:-1]) * b.shape[-1]
    return out <= _CHEAP_MATMUL * (a.numel() + b.numel())


def _draws_random(op, args, kwargs):
    """Whether this call of `op` draws random numbers: an attention kernel
    with dropout (dropout_p above 0), or an op PyTorch tags as seeded. Such
    an op runs again in the re-run. The re-run restores the RNG state the
    forward began with and must draw what the forward drew, in the same
    order. An output read from the saved ones draws nothing, so every random
    op after it would draw other numbers: GPT-2's SDPA attention with
    dropout, saved, left the residual dropout after it another mask."""
    schema = getattr(op, "_schema", None)
    for i, argument in enumerate(schema.arguments if schema is not None else ()):
        if argument.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", argument.default_value)
            return bool(p)
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def _policy(ctx, op, *args, **kwargs):
    """Saves the costly ops' outputs; everything else runs again."""
    policy = torch.utils.checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if _saves(op, args, kwargs) else policy.PREFER_RECOMPUTE


class _Replayed(list):
    """The saved outputs of one op in one selective unit, as the re-run
    reads them: PyTorch's re-run takes them with pop(0) and refuses a second
    backward once they are gone ("backward an extra time"); this list hands
    them out from a cursor instead, which each re-run sets back to the start,
    so that backward(retain_graph=True) twice works as without checkpoint.
    They are freed with the unit's graph."""
    cursor = 0

    def pop(self, index=-1):
        item = list.__getitem__(self, self.cursor)
        self.cursor += 1
        return item

    def __len__(self):
        return list.__len__(self) - self.cursor


class _Rerun:
    """The re-run's context: the outputs' cursors back to the start, then
    PyTorch's cached mode."""

    def __init__(self, mode, storage):
        self.mode, self.storage = mode, storage

    def __enter__(self):
        for outputs in self.storage.values():
            outputs.cursor = 0
        return self.mode.__enter__()

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


class _Offloaded(_Replayed):
    """The saved outputs of one op in one selective-offload unit: each
    tensor in them goes to the engine's loop (its pack, as the unit's
    saved tensors do: the loop's layer schedule moves it to host and back)
    as PyTorch's forward mode stores it, and comes back from the loop's
    unpack at each re-run that reads it."""

    def __init__(self, loop):
        super().__init__()
        self.loop = loop

    def append(self, item):
        list.append(self, torch.utils._pytree.tree_map(self._pack, item))

    def pop(self, index=-1):
        return torch.utils._pytree.tree_map(self._unpack, _Replayed.pop(self, index))

    def _pack(self, leaf):
        if isinstance(leaf, torch.Tensor):
            return _Packed(None, None, self.loop.pack(leaf))
        field = _tensor_field(leaf)
        if field is None:
            return leaf  # not a tensor: stays as it is
        packed = self.loop.pack(getattr(leaf, field))
        # The wrapper lets go of the tensor: the loop's copy is then the
        # only reference, and its device memory goes when the copy is out.
        setattr(leaf, field, None)
        return _Packed(leaf, field, packed)

    def _unpack(self, leaf):
        if not isinstance(leaf, _Packed):
            return leaf
        tensor = self.loop.unpack(leaf.packed)  # the loop checks its version
        if leaf.wrapper is None:
            return tensor
        wrapper = copy.copy(leaf.wrapper)
        setattr(wrapper, leaf.field, tensor)
        if hasattr(wrapper, "version"):
            wrapper.version = tensor._version
        return wrapper


class _Packed:
    """A saved output the loop took: PyTorch's wrapper of it without it
    (None for a bare tensor), the wrapper's field that held it, and what
    the loop's pack returned."""

    __slots__ = ("wrapper", "field", "packed")

    def __init__(self, wrapper, field, packed):
        self.wrapper, self.field, self.packed = wrapper, field, packed


def _tensor_field(wrapper):
    """The attribute of PyTorch's wrapper of a saved output that holds the
    tensor ("val" in torch 2.4 to 2.11, "value" later), or None."""
    for field in ("val", "value"):
        if isinstance(getattr(wrapper, field, None), torch.Tensor):
            return field
    return None


def _selective_contexts(loop=None):
    """torch.utils.checkpoint's context_fn for a selective unit: PyTorch's
    selective-checkpoint modes with the policy above, their shared storage
    made replayable (selective_available checks that it is a
    defaultdict(list), as in torch 2.4 to 2.11) and, given the engine's
    `loop`, offloaded through it (selective-offload)."""
    forward, rerun = torch.utils.checkpoint.create_selective_checkpoint_contexts(_policy)
    forward.storage.default_factory = (
        _Replayed if loop is None else functools.partial(_Offloaded, loop))
    return forward, _Rerun(rerun, forward.storage)


def compiled(unit):
    """Whether `unit.compile()` compiled it. Such a unit is kept, offloaded
    or recomputed whole, never selectively (the selective policy is a
    dispatch mode around the compiled code). Recomputed, its Checkpointed
    wrapper takes the place of its compiled call (`_compiled_call_impl`,
    which Module.__call__ runs in place of the hooks and forward), not of
    its `forward`: the checkpoint lies outside the compiled code, as Hugging
    Face's gradient checkpointing of compiled layers puts it, and the re-run
    runs the same compiled graph as the forward. Loss and gradients then
    equal the compiled model's bit for bit, dropout included. (Traced inside
    by torch.compile, a checkpoint made another graph, with other fusions
    and other dropout draws: GPT-2's loss moved from 7.0192 to 7.0065, run
    71; and a wrapper deciding per call saved another set of tensors in the
    compiled forward than in the re-run, which checkpoint refused.)"""
    return getattr(unit, "_compiled_call_impl", None) is not None


def wrapper_slot(unit):
    """The attribute a recomputed unit's wrapper takes (see compiled):
    its compiled call if it was compiled, else its forward."""
    return "_compiled_call_impl" if compiled(unit) else "forward"


def restore_forward(unit):
    """Takes the budgets' wrappers off `unit`: its forward (and compiled
    call) are again what they were before the first."""
    own = unit.__dict__.get("forward")
    while isinstance(own, Checkpointed):
        own = own.forward
    if getattr(own, "__self__", None) is unit and \
            getattr(own, "__func__", None) is type(unit).forward:
        del unit.forward
    elif "forward" in unit.__dict__:
        unit.forward = own
    call = unit.__dict__.get("_compiled_call_impl")
    if isinstance(call, Checkpointed):
        while isinstance(call, Checkpointed):
            call = call.forward
        unit._compiled_call_impl = call


def _own_forward(forward):
    """What a copied Checkpointed becomes: the forward it wrapped."""
    return forward


class Checkpointed:
    """A recomputed unit's forward: torch.utils.checkpoint (non-reentrant,
    RNG state preserved; with the selective policy above where the choice is
    "selective" or "selective-offload", whose saved outputs then go through
    the budget's engine loop, `budget.loop(index)`, where it takes the unit's
    saved tensors now) around the unit's own forward where its budget says so
    (JointBudget.checkpoints) and, in a backward, as the forward it re-runs
    did (an outer checkpoint's re-run must save what the forward saved); the
    unit's own forward elsewhere."""

    def __init__(self, budget, index, forward):
        self.budget, self.index, self.forward = budget, index, forward
        self.checkpointed = None  # what its last forward (with grad) did

    def __reduce_ex__(self, protocol):
        """A copy of the unit (copy.deepcopy(model): an EMA model,
        torch.optim.swa_utils.AveragedModel; torch.save(model)) gets the
        unit's own forward, not the budget (whose engine cannot be copied):
        the budget recomputes the units it was given."""
        return _own_forward, (self.forward,)

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        if not _common.in_backward():
            self.checkpointed = self.budget.checkpoints(self.index)
        if self.checkpointed is None:
            return self.forward(*args, **kwargs)
        if self.checkpointed == "selective":
            kwargs = dict(kwargs, context_fn=_selective_contexts)
        elif self.checkpointed == "selective-offload":
            kwargs = dict(kwargs, context_fn=functools.partial(
                _selective_contexts, self.budget.loop(self.index)))
        return torch.utils.checkpoint.checkpoint(
            _RerunWithoutCaches(self.forward), *args, use_reentrant=False, **kwargs)


def _is_cache(value):
    """A key/value cache as Hugging Face's Cache classes are used."""
    return (callable(getattr(value, "update", None))
            and callable(getattr(value, "get_seq_length", None)))


class _RerunWithoutCaches:
    """A checkpointed forward whose re-runs get None for any key/value
    cache argument. A Hugging Face model left with use_cache=True (its
    config's default) fills a fresh cache in each training forward; a
    re-run in the backward would append the same keys and values again and
    attend to both. Without the cache the re-run computes what the forward
    did (its cache was empty before the forward's own update), and the
    cache stays as the forward left it. (What Hugging Face's own gradient
    checkpointing does instead: use_cache=False for the whole forward.)"""

    __slots__ = ("forward", "ran")

    def __init__(self, forward):
        self.forward, self.ran = forward, False

    def __call__(self, *args, **kwargs):
        if self.ran:
            args = tuple(None if _is_cache(a) else a for a in args)
            kwargs = {k: None if _is_cache(v) else v for k, v in kwargs.items()}
        self.ran = True
        return self.forward(*args, **kwargs)


class UnitForwards:
    """How a budget's units run in its context's forward (budget.py's
    JointBudget.install and uninstall). A recomputed unit's wrapper
    (Checkpointed), once made, stays its `forward`, or its compiled call for
    a compiled unit (see compiled), the same object each time: outside the
    context's forward it runs the unit's own, except in a backward, where
    someone else's checkpoint around the unit (Hugging Face's gradient
    checkpointing) re-runs what the forward ran; a re-run must save what
    the forward saved, or that checkpoint refuses it (CheckpointError)."""

    def __init__(self, budget, units):
        self.budget, self.units = budget, units
        self.wrappers = {}  # unit index -> its Checkpointed
        self._choices = {}  # in the forward: index -> "recompute", "selective", "selective-offload"
        self._in_forward = False

    def take_others_off(self):
        """Takes another budget's wrappers (an earlier OffloadActivations
        of the model) off the units."""
        for index, unit in enumerate(self.units):
            if any(isinstance(w, Checkpointed) and w.budget is not self.budget
                   for w in (unit.__dict__.get("forward"),
                             unit.__dict__.get("_compiled_call_impl"))):
                restore_forward(unit)
                self.wrappers.pop(index, None)

    def install(self, choices):
        """The context's forward begins: unit i runs as choices[i] says
        ("keep", "offload", "recompute", "selective" or
        "selective-offload")."""
        self._in_forward = True
        self._choices = {}
        for index, choice in enumerate(choices):
            if choice in ("recompute", "selective", "selective-offload"):
                self._wrap(index, choice)

    def also(self, indices, choice):
        """In the context's forward, before they are called: the units
        `indices` run as `choice` too (a profile window's end,
        budget_windows.py)."""
        for index in indices:
            self._wrap(index, choice)

    def _wrap(self, index, choice):
        unit = self.units[index]
        self._choices[index] = choice
        slot = wrapper_slot(unit)
        if unit.__dict__.get(slot) is not self.wrappers.get(index, False):
            # New, or the unit compiled since (its forward traced by
            # torch.compile must be its own again).
            restore_forward(unit)
            self.wrappers[index] = Checkpointed(self.budget, index, getattr(unit, slot))
            setattr(unit, slot, self.wrappers[index])

    def uninstall(self):
        """The context's forward ended: the wrappers run their units' own
        forwards from now on, but for a re-run in the backward of this
        forward."""
        self._in_forward = False

    def checkpoints(self, index):
        """"recompute", "selective", "selective-offload" or None: how unit
        `index` runs now."""
        return self._choices.get(index) if self._in_forward else None
