"""What the three front doors share: the extension, sessions, and the
saved-tensor hooks' filter (SPEC §1.2) in front of the engine's Push/Pop."""

import os

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
    return base is not None and base.is_leaf and base.requires_grad


def keep(tensor):
    """What a pack hook returns for a tensor it keeps: the tensor and its
    version, so that unpack can raise autograd's in-place error (hooks
    bypass autograd's own check)."""
    return (tensor, tensor._version)


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
        # Parameters (a subclass) and other subclasses stay as they are.
        if type(tensor) is not torch.Tensor or tensor.layout is not torch.strided:
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


def queue_after_backward(callback):
    """Runs `callback` once the running backward pass has finished."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class LayerBackward:
    """The layer mode's backward steps, for TE's front door and
    OffloadActivations: the engine's BackwardStep(layer) as each layer's
    backward begins, and FinishBackward when the backward pass that reached
    layer 0 has ended."""

    def __init__(self, core):
        self.core = core
        self.begun = False  # a backward began since the last FinishBackward
        self._reached_first = False
        self._finish_queued = False

    def step(self, layer):
        self.core.backward_step(layer)
        self.begun = True
        if layer == 0:
            self._reached_first = True
        if not self._finish_queued:
            self._finish_queued = True
            queue_after_backward(self._pass_ended)

    def _pass_ended(self):
        self._finish_queued = False
        if self._reached_first:
            self._reached_first = False
            self.begun = False
            self.core.finish_backward()


class BackwardStepAt(torch.autograd.Function):
    """Identity on a layer's output; its backward calls backward.step(layer)
    (a LayerBackward): the gradient reaching the output means the layer's
    backward begins (TE's sync function, OffloadActivations' layer ends)."""

    @staticmethod
    def forward(ctx, tensor, backward, layer):
        ctx.backward_steps = backward
        ctx.layer = layer
        return tensor

    @staticmethod
    def backward(ctx, grad):
        ctx.backward_steps.step(ctx.layer)
        return grad, None, None
