"""What the front doors share: the extension, sessions, the layer-end
hooks of the TrainingLoop's front doors (te.py, whole_model.py), and the
fine-grained door's saved-tensor filter (SPEC §1.2) in front of its
Push/Pop."""

import inspect
import os
import sys
import warnings

import torch

from . import _build

_ext = None


def ext():
    """The compiled engine (actoffload._C), built at first use."""
    global _ext  # the loaded module, cached like any import
    if _ext is None:
        _ext = _build.load_extension(
            verbose=os.environ.get("ACTOFFLOAD_VERBOSE_BUILD") == "1")
    return _ext


def OffloadError():  # noqa: N802 - the exception class, once built
    return ext().OffloadError


def new_session(backend=None, device=None, **sim_options):
    """A Session: the engine's backend and the torch/engine tensor seam.

    backend: "cuda" (PyTorch's current stream and caching allocator), "sim"
    (the simulated GPU; tensors are CPU tensors standing in for device
    tensors), or None: ACTOFFLOAD_BACKEND if set, else "cuda" when a GPU is
    there, else "sim".
    """
    if backend is None:
        backend = os.environ.get("ACTOFFLOAD_BACKEND") or (
            "cuda" if torch.cuda.is_available() else "sim")
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "actoffload: backend 'cuda' needs a CUDA build of PyTorch and "
                "a GPU (torch.cuda.is_available() is False); use backend='sim' "
                "for the simulated GPU")
        if not ext().with_cuda:
            raise RuntimeError(
                "actoffload was compiled without CUDA (no CUDA toolkit was "
                "found at build time); rebuild with CUDA_HOME set")
        if device is None:
            device = torch.cuda.current_device()
        elif isinstance(device, torch.device):
            device = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.init()
        return ext().Session("cuda", device=int(device))
    if backend == "sim":
        return ext().Session("sim", **sim_options)
    raise ValueError(f"actoffload: unknown backend {backend!r} (expected 'cuda' or 'sim')")


def _weight_like(tensor):
    """A parameter, or a view of one: never offloaded (SPEC §1.2; its memory
    stays with the model anyway)."""
    if isinstance(tensor, torch.nn.Parameter):
        return True
    if tensor.is_leaf and tensor.requires_grad:
        return True
    base = tensor._base
    return base is not None and (isinstance(base, torch.nn.Parameter) or
                                 (base.is_leaf and base.requires_grad))


def dtensor_shard(tensor):
    """A DTensor activation (tensor parallelism) as (its local shard, what
    rebuilds it), or None for any other subclass, and for a DTensor that is a
    parameter or a view of one (SPEC §7.5). Offloading the shard alone never
    gathers the whole tensor; dtensor_of puts it back with the same mesh,
    placements, shape and stride."""
    module = sys.modules.get("torch.distributed.tensor")
    if module is None or not isinstance(tensor, module.DTensor) or _weight_like(tensor):
        return None
    with torch.no_grad():
        local = tensor.to_local()
    return local, (tensor.device_mesh, tuple(tensor.placements),
                   tuple(tensor.shape), tuple(tensor.stride()))


def dtensor_of(local, parts):
    """The DTensor dtensor_shard took apart, around its (reloaded) shard."""
    from torch.distributed.tensor import DTensor
    mesh, placements, shape, stride = parts
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)


class _Shard:
    """What the Python pack hook hands autograd for a DTensor whose shard
    the engine took."""

    __slots__ = ("local", "parts")

    def __init__(self, local, parts):
        self.local, self.parts = local, parts


def keep(tensor):
    """What a pack hook returns for a tensor it keeps: the tensor and its
    version, so that unpack can raise autograd's in-place error (hooks
    bypass autograd's own check). A detached alias, not the tensor itself:
    an op's saved output holding its own node through the hook's result
    would be a cycle that keeps the graph alive."""
    return (tensor.detach(), tensor._version)


def unkeep(packed):
    tensor, version = packed
    if tensor._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been "
            f"modified by an inplace operation: [{tensor.dtype} {list(tensor.shape)}] "
            f"is at version {tensor._version}; expected version {version} instead.")
    return tensor


class SavedTensorFilter:
    """The pack/unpack pair in front of an engine front door (`door`, with
    push and pop): tensors the engine would only hand back (parameters,
    marked tensors, small ones, other devices, non-strided layouts, tensor
    subclasses) are kept by the hook itself, cheaply; the rest go to the
    engine."""

    def __init__(self, session, door, min_elements):
        self.session = session
        self.door = door
        self.min_elements = min_elements
        self.device = torch.device(session.device)
        self._handle_type = ext().Handle

    def pack(self, tensor):
        # Parameters (a subclass) and other subclasses stay as they are,
        # but for a DTensor activation's local shard.
        if type(tensor) is not torch.Tensor:
            shard = None if isinstance(tensor, torch.nn.Parameter) else dtensor_shard(tensor)
            if shard is None:
                return keep(tensor)
            local = self.pack(shard[0])
            return keep(tensor) if type(local) is tuple else _Shard(local, shard[1])
        if tensor.layout is not torch.strided:
            return keep(tensor)
        if tensor.numel() < self.min_elements or _weight_like(tensor):
            return keep(tensor)
        if getattr(tensor, "_actoffload_do_not_offload", False):
            return keep(tensor)
        if tensor.device != self.device:
            if self.device.type == "cpu" or tensor.device.type == "cpu":
                return keep(tensor)  # not in device memory: never offloaded
            # Another GPU: the engine's error names both devices.
        ready = getattr(tensor, "_actoffload_ready", None)
        offload_base = getattr(tensor, "_actoffload_offload_base", False)
        packed = self.door.push(tensor, False, False, offload_base, ready)
        return keep(packed) if packed is tensor else packed

    def unpack(self, packed):
        if type(packed) is _Shard:
            return dtensor_of(self.unpack(packed.local), packed.parts)
        if type(packed) is self._handle_type:
            return self.door.pop(packed)  # checks the version itself
        return unkeep(packed)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def check_stream(session):
    """The engine orders its copies against the compute stream it was made
    with: PyTorch's current stream must still be that one."""
    if session.kind != "cuda":
        return
    current = torch.cuda.current_stream().cuda_stream
    if current != session.compute_stream_handle:
        raise ext().OffloadError(
            "actoffload: PyTorch's current CUDA stream changed since the "
            f"offloader was made (stream {current:#x}, offloader's "
            f"{session.compute_stream_handle:#x}); make the offloader under "
            "the stream the model runs on")


def eagerly(hook):
    """The hook, run outside torch.compile's graphs (torch >= 2): a module
    compiled with `module.compile()` traces its hooks, and what they do (the
    engine's steps, the saved-tensor hooks a unit pushes, what the budget
    measures: the allocator's counters, CUDA events) must happen when the
    hook runs, not when a graph is traced."""
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo.disable(hook) if dynamo is not None else hook


def in_backward():
    """Whether autograd's engine is running a backward pass on this thread
    (a checkpoint's recompute runs forwards there: they are not offloaded)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def end_stale_pass(loop):
    """A backward pass that raised never ran its end callback: at the next
    forward, outside any backward, it has ended."""
    if loop.pass_open and not in_backward():
        loop.pass_ended()


def close_abandoned_checkpoints(tb):
    """Ends the non-reentrant checkpoints that an exception, traced by `tb`,
    left open. PyTorch's checkpoint (torch >= 2.1) runs its function between
    two steps of a generator whose `with` holds its saved-tensor hooks and
    its context_fn's modes (a selective unit's); where the function raises,
    the second step never runs and they stay in force until the generator is
    collected with the traceback. The engine's hooks pushed below them
    (UnitHooks) could not come off until then, and would then be left in
    force. Each such generator is closed, innermost first, which runs its
    `with`'s exit: the stack is as if the checkpoints had returned."""
    open_ = []
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if (inspect.isgenerator(value)
                    and value.gi_code.co_name == "_checkpoint_without_reentrant_generator"
                    and inspect.getgeneratorstate(value) == inspect.GEN_SUSPENDED):
                open_.append(value)
        tb = tb.tb_next
    for generator in reversed(open_):
        generator.close()


def compiled_anything():
    """Whether torch.compile (dynamo) has compiled a graph in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils is not None and utils.counters["stats"]["unique_graphs"] > 0


def pushes(loop):
    """How many saved tensors reached `loop`'s pack so far."""
    stats = loop.stats()
    return stats["tensors_offloaded"] + stats["tensors_kept"]


def offloaded(loop):
    """How many saved tensors `loop` offloaded so far."""
    return loop.stats()["tensors_offloaded"]


UNREACHED = (
    "A model compiled whole (torch.compile(model), or model.compile()) runs "
    "its compiled graph without the module hooks registered after it was "
    "traced, and hands over what it saves all at once as that graph ends, "
    "when the backward is next to need it: compile each layer instead "
    "(layer.compile() for each), as torchtune's recipes do")


def emit_warnings(loop):
    """The engine's new warnings as Python warnings."""
    for message in loop.new_warnings():
        warnings.warn("actoffload: " + message, stacklevel=3)


class _LayerEnd:
    """A tensor hook on a layer's output: the gradient reaching it begins
    the layer's backward (the engine's BackwardStep)."""

    __slots__ = ("loop", "ref", "layer")

    def __init__(self, loop, ref, layer):
        self.loop, self.ref, self.layer = loop, ref, layer

    def __call__(self, grad):
        self.loop.backward_step(self.ref, self.layer)


def first_tensor(args, kwargs=None):
    """The first tensor among a call's positional arguments, then its
    keyword arguments' values, or None."""
    items = list(args) + (list(kwargs.values()) if kwargs else [])
    return next((t for t in items if isinstance(t, torch.Tensor)), None)


def tensor_bytes(tensor):
    return tensor.numel() * tensor.element_size()


def first_grad_tensor(output):
    """The first tensor that requires grad in a layer's output: a tensor, a
    tuple or list (Hugging Face layers), or a mapping's values."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor) and item.requires_grad:
                return item
    return None


def mark_layer_end(loop, ref, layer, output):
    """Hooks the layer's backward step on its output, which stays the very
    object it was (in-place ops on it stay legal). An output without a
    tensor that requires grad (a frozen layer) gets no hook: its backward
    never runs."""
    tensor = first_grad_tensor(output)
    if tensor is not None and layer >= 0:
        tensor.register_hook(_LayerEnd(loop, ref, layer))


def saved_hooks_top():
    """The innermost saved-tensor hooks now in force, (pack, unpack), or None;
    NotImplemented where the torch version cannot say (< 2.8)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return NotImplemented if top is None else top(True)


def nobody_pushed_since(outer):
    """Whether the saved-tensor hooks in force are still `outer` (what
    saved_hooks_top() gave earlier; None: none), the pack hook compared.
    REQUIRES: the torch version can say (saved_hooks_top)."""
    top = saved_hooks_top()
    return top is None if outer is None else (top is not None and top[0] is outer[0])


class UnitHooks:
    """The engine's saved-tensor hooks, in force only inside the units the
    engine offloads (whole_model.py: a budget's plan, TE's schedule of
    layers): everywhere else autograd saves tensors as without the context,
    at no cost per tensor (about 3 us each through the hooks; 1.3 ms of
    GPT-2's 15 ms forward on an H100).

    A unit's hooks are pushed as its forward begins (unit_begins, called for
    the offloaded units only) only where nobody pushed hooks since the
    context's forward began (`outer`): under an outer checkpoint (Hugging
    Face's gradient checkpointing) or a NoOpManager, theirs stay innermost
    and win, as they do over hooks in force for the whole forward. REQUIRES:
    the torch version can say which hooks are in force (saved_hooks_top)."""

    def __init__(self, pack, unpack):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        # A compiled unit's: sparse views stay on device (keeps_layout).
        self.compiled_hooks = torch.autograd.graph.saved_tensors_hooks(
            keeps_layout(pack), unpack)
        self.outer = saved_hooks_top()
        self.pushed = []  # (unit, its hooks) in force, innermost last

    def _ours_on_top(self):
        top = saved_hooks_top()
        return top is not None and top[0] is self.pushed[-1][1].pack_hook

    def unit_begins(self, index, compiled=False):
        if nobody_pushed_since(self.outer):
            hooks = self.compiled_hooks if compiled else self.hooks
            hooks.__enter__()
            self.pushed.append((index, hooks))

    def in_force(self, index):
        """Whether unit `index`'s hooks are in force."""
        return any(unit == index for unit, _ in self.pushed)

    def unit_ends(self, index):
        if self.pushed and self.pushed[-1][0] == index and self._ours_on_top():
            self.pushed.pop()[1].__exit__(None, None, None)

    def close(self):
        """At the context's exit: hooks a unit that raised left in force."""
        while self.pushed and self._ours_on_top():
            self.pushed.pop()[1].__exit__(None, None, None)
        self.pushed = []


# The engine copies a view with its whole span where the view covers at
# least this share of the bytes it spans (the engine's min_span_coverage);
# a sparser one is gathered and comes back contiguous.
MIN_SPAN_COVERAGE = 0.5


def keeps_layout(pack):
    """`pack` for the tensors a unit compiled by torch.compile saves: a view
    covering less than MIN_SPAN_COVERAGE of the bytes it spans stays on
    device. The engine would hand it back contiguous, and the compiled
    backward checks each saved tensor's strides (Phi3's query, key and value,
    each a third of its fused projection, failed inductor's stride assert)."""
    def pack_keeping_layout(tensor):
        if (type(tensor) is torch.Tensor and tensor.layout is torch.strided
                and tensor.numel() > 0):
            span = 1 + sum((size - 1) * stride for size, stride
                           in zip(tensor.shape, tensor.stride()))
            if tensor.numel() < MIN_SPAN_COVERAGE * span:
                return keep(tensor)
        return pack(tensor)
    return pack_keeping_layout
