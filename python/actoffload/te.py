"""Transformer Engine's front door, drop-in: get_cpu_offload_context,
mark_not_offload, start_offload (SPEC §1-§4, §7; engine/training_loop.h).

    from actoffload import get_cpu_offload_context
    ctx, sync_fn = get_cpu_offload_context(True, num_layers=2, model_layers=8)
    for layer in layers:
        with ctx:
            x = layer(x)
        x = sync_fn(x)
    loss(x).backward()

Entering the context is a layer's forward step in the engine's
TrainingLoop (the first layer of a forward begins an iteration of its own);
inside it the engine's C++ pack and unpack hooks take every saved tensor.
sync_fn(x) returns x itself and puts a hook on it: when the gradient
reaches it, that layer's backward begins (reloads start there). A saved
tensor unpacked before its layer's hook ran begins that layer's backward
itself, so a forgotten or ignored sync_fn costs prefetching, never
correctness. The iteration ends with the backward pass, whatever layers it
reached; the life cycle is the engine's (docs/python.md).
"""

import contextlib
import warnings

import torch

from . import _common


def mark_not_offload(*tensors):
    """Keeps these tensors on the device (TE's mark_not_offload; TE's own
    _TE_do_not_offload flag is honoured too)."""
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            tensor._actoffload_do_not_offload = True


def start_offload(*tensors, offload_base_tensor=False):
    """Marks these tensors' bytes final (TE's start_offload): their copy to
    host may start before the layer ends. With offload_base_tensor, the
    whole storage is offloaded even when the views cover little of it."""
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        tensor._actoffload_start_offload = True
        if offload_base_tensor:
            tensor._actoffload_offload_base = True


class CpuOffloadContext(contextlib.ContextDecorator):
    """The context manager get_cpu_offload_context returns: one layer's
    forward per `with` (usable as a decorator, as TE's)."""

    def __init__(self, session, loop):
        self._session = session
        self._loop = loop
        self._hooks = None
        self._ref = None        # the running layer's hold on its iteration
        self._layer = -1        # its id (-1: outside offloading)
        self._synced = True     # sync_function ran since the last enter
        self._passthrough = 0   # nesting of enters with grad disabled
        self._module_hook = None

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError(
                f"actoffload: the offload context was entered again inside "
                f"layer {self._layer}'s forward; each layer enters it once "
                "(with ctx: x = layer(x)), then x = sync_function(x)")
        if not torch.is_grad_enabled() or _common.in_backward():
            self._passthrough += 1  # nothing is saved for this backward
            return self
        _common.check_stream(self._session)
        _common.end_stale_pass(self._loop)
        ref, layer, _ = self._loop.forward_step(-1)
        _common.emit_warnings(self._loop)
        self._ref, self._layer = ref, layer
        self._synced = False
        if layer == 0:
            self._loop.set_model_tensors([])  # a new forward: modules anew
        # SPEC §7.5: the parameters and buffers of every module that runs
        # inside the layer are never offloaded (TE's context is not told
        # the modules; PyTorch's global module hook, only while inside).
        self._module_hook = torch.nn.modules.module.register_module_forward_pre_hook(
            self._note_module)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._loop.pack, self._loop.unpack)
        self._hooks.__enter__()
        return self

    def _note_module(self, module, args):
        tensors = [t for t in module._buffers.values() if t is not None]
        tensors.extend(t for t in module._parameters.values() if t is not None)
        if tensors:
            self._loop.add_model_tensors(tensors)

    def __exit__(self, exc_type, exc, tb):
        if self._passthrough:
            self._passthrough -= 1
            return False
        if exc_type is not None:  # the hooks on top are ours again
            _common.close_abandoned_checkpoints(tb)
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(exc_type, exc, tb)
        module_hook, self._module_hook = self._module_hook, None
        if module_hook is not None:
            module_hook.remove()
        if exc_type is not None:
            # SPEC §7.2: the forward raised; its iteration is dropped now.
            self._ref = None
            self._loop.abandon_forward()
            _common.emit_warnings(self._loop)
        return False

    def _sync(self, output):
        if self._hooks is not None:
            raise RuntimeError(
                "actoffload: sync_function was called inside the offload "
                "context; call it on the layer's output after the `with` block")
        if self._synced:
            return output  # no layer ran since (grad disabled), or twice
        self._synced = True
        ref, self._ref = self._ref, None
        if ref is not None:
            _common.mark_layer_end(self._loop, ref, self._layer, output)
        return output

    # Introspection (extensions).
    @property
    def offloader(self):
        """The engine's TrainingLoop (stats, warnings, plans)."""
        return self._loop


class SyncFunction:
    """sync_function: call on each layer's output; returns it unchanged.
    With manual synchronization it also offers TE's
    ManualOffloadSynchronizer calls."""

    def __init__(self, context, manual):
        self._context = context
        self._manual = manual

    def __call__(self, tensor):
        return self._context._sync(tensor)

    def _manual_call(self, name, call, layer_id):
        if not self._manual:
            raise RuntimeError(
                f"actoffload: {name} needs manual_synchronization=True")
        if self._context is not None:
            self._context._loop.manual(call, layer_id)

    def start_offload_layer(self, layer_id):
        self._manual_call("start_offload_layer", 0, layer_id)

    def release_activation_forward_gpu_memory(self, layer_id):
        self._manual_call("release_activation_forward_gpu_memory", 1, layer_id)

    def start_reload_layer(self, layer_id):
        self._manual_call("start_reload_layer", 2, layer_id)


def get_cpu_offload_context(enabled=False, num_layers=1, model_layers=1,
                            offload_activations=True, offload_weights=False,
                            double_buffering=False, manual_synchronization=False,
                            retain_pinned_cpu_buffers=False, offload_stream=None,
                            *, min_offload_size=256 * 1024, backend=None,
                            session=None):
    """TE's get_cpu_offload_context on the C++ engine, with TE's argument
    checks, error classes and warnings (docs/python.md has the table).

    Returns (context, sync_function); with manual_synchronization,
    (context, sync_function, synchronizer), where the synchronizer offers
    start_offload_layer, release_activation_forward_gpu_memory and
    start_reload_layer (so does the sync function). Disabled: a null
    context and an identity (and None for the synchronizer), before any
    check, as TE.
    Extensions: min_offload_size (elements, TE's 256 Ki; SPEC §1.2),
    backend ("cuda", "sim"), session (share one backend between offloaders).
    """
    if not enabled:
        if manual_synchronization:
            return contextlib.nullcontext(), _identity, None
        return contextlib.nullcontext(), _identity
    if not offload_activations and not offload_weights:
        raise ValueError(
            "CPU Offloading is enabled while it is not mentioned what to "
            "offload (weights/activations)")
    if offload_weights:
        warnings.warn("actoffload: offloading weights is deprecated (as in TE) "
                      "and not done: weights stay on the device, SPEC §1.2",
                      DeprecationWarning, stacklevel=2)
        if not offload_activations:
            if manual_synchronization:
                return contextlib.nullcontext(), _identity, None
            return contextlib.nullcontext(), _identity
    if not isinstance(model_layers, int) or model_layers < 1:
        raise ValueError(f"model_layers must be a positive int, got {model_layers!r}")
    if not manual_synchronization:
        if num_layers is None or not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(
                f"num_layers must be an int in [0, model_layers - 1], got {num_layers!r}")
        if num_layers > model_layers - 1:
            raise ValueError(
                "Cannot offload all layers without manual synchronization - "
                "last layer is not offloaded. Got "
                f"num_layers={num_layers}, model_layers={model_layers}")
        if num_layers == model_layers - 1 and model_layers > 1:
            warnings.warn(
                "Offloading num_layers == model_layers - 1 is not recommended, "
                "it prevents overlapping of computation and offload/reload.",
                stacklevel=2)
        if offload_stream is not None:
            raise ValueError(
                "offload_stream can be provided only if manual_synchronization is True")
    if double_buffering:
        warnings.warn("actoffload: double_buffering has no effect (pinned "
                      "buffers are pooled; see retain_pinned_cpu_buffers)",
                      stacklevel=2)
    stream_handle = 0
    if offload_stream is not None:
        # Manual mode only (checked above): both directions copy on it.
        if session is None:
            session = _common.new_session(backend)
        if session.kind != "cuda":
            raise ValueError("actoffload: offload_stream is a CUDA stream; this "
                             f"offloader runs on the {session.kind!r} backend")
        stream_handle = int(offload_stream.cuda_stream)
    if session is None:
        session = _common.new_session(backend)
    loop = _common.ext().TrainingLoop(
        session, model_layers=model_layers,
        offloaded_layers=0 if manual_synchronization else num_layers,
        manual=manual_synchronization, retain=retain_pinned_cpu_buffers,
        min_offload_elements=min_offload_size, offload_stream=stream_handle)
    context = CpuOffloadContext(session, loop)
    sync = SyncFunction(context, manual_synchronization)
    if manual_synchronization:
        return context, sync, sync
    return context, sync


def _identity(tensor):
    return tensor
