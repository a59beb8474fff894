"""Transformer Engine's front door, drop-in: get_cpu_offload_context,
mark_not_offload, start_offload (SPEC §1-§4, engine/offload.h).

    from actoffload import get_cpu_offload_context
    ctx, sync_fn = get_cpu_offload_context(True, num_layers=2, model_layers=8)
    for layer in layers:
        with ctx:
            x = layer(x)
        x = sync_fn(x)
    loss(x).backward()

Entering the context is the engine's ForwardStep (the previous layer's
group closes and its offload starts); inside it, saved_tensors_hooks push
every saved tensor to the engine. sync_fn(x) is an identity whose backward
is the engine's BackwardStep for that layer (reloads start there); the end
of the backward pass that reached layer 0 is FinishBackward.
"""

import contextlib
import warnings

import torch

from . import _common


def mark_not_offload(*tensors):
    """Keeps these tensors on the device (TE's mark_not_offload)."""
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            tensor._actoffload_do_not_offload = True


def start_offload(*tensors, offload_base_tensor=False):
    """Marks these tensors' bytes final now (TE's start_offload): their copy
    to host may start before the layer ends. With offload_base_tensor, the
    whole storage is offloaded even when the views cover little of it."""
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        tensor._actoffload_start_offload = True
        if offload_base_tensor:
            tensor._actoffload_offload_base = True


class CpuOffloadContext:
    """The context manager get_cpu_offload_context returns: one layer's
    forward per `with`."""

    def __init__(self, session, core, min_elements):
        self._session = session
        self._core = core
        self._filter = _common.SavedTensorFilter(session, core, min_elements)
        self._filter.pack = self._pack
        self._hooks = None
        self._layer = None          # the layer whose forward is open or last ran
        self._awaiting_sync = False
        self._backward = _common.LayerBackward(core)
        self._passthrough = False

    # The pack hook: layers the schedule keeps skip the engine (SPEC §4.4).
    def _pack(self, tensor):
        if not self._layer_offloaded:
            return _common.keep(tensor)
        ready_wanted = getattr(tensor, "_actoffload_start_offload", False)
        if ready_wanted and getattr(tensor, "_actoffload_ready", None) is None:
            tensor._actoffload_ready = self._session.record_ready()
        return _common.SavedTensorFilter.pack(self._filter, tensor)

    def __enter__(self):
        if self._hooks is not None:
            raise _common.ext().OffloadError(
                f"actoffload: the offload context was entered again inside "
                f"layer {self._layer}'s forward")
        if not torch.is_grad_enabled():
            self._passthrough = True  # nothing is saved for backward
            return self
        if self._awaiting_sync:
            raise _common.ext().OffloadError(
                f"actoffload: layer {self._layer}'s output did not go through "
                f"sync_function before the next layer's forward")
        _common.check_stream(self._session)
        self._layer = self._core.forward_step()
        self._layer_offloaded = self._core.will_offload(self._layer)
        self._hooks = self._filter.hooks()
        self._hooks.__enter__()
        self._awaiting_sync = True
        return self

    def __exit__(self, *exc):
        if self._passthrough:
            self._passthrough = False
            return False
        hooks, self._hooks = self._hooks, None
        hooks.__exit__(*exc)
        return False

    def _sync(self, tensor):
        if not self._awaiting_sync:
            return tensor  # no offloaded forward to close (grad disabled)
        self._awaiting_sync = False
        if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
            return tensor
        return _common.BackwardStepAt.apply(tensor, self._backward, self._layer)

    # Introspection (extensions).
    @property
    def offloader(self):
        """The engine's layer-mode front door (state, stats, warnings)."""
        return self._core


class SyncFunction:
    """sync_function: call on each layer's output. With manual
    synchronization it also offers TE's ManualOffloadSynchronizer calls."""

    def __init__(self, context, manual):
        self._context = context
        self._manual = manual

    def __call__(self, tensor):
        return self._context._sync(tensor)

    def _manual_only(self, name):
        if not self._manual:
            raise _common.ext().OffloadError(
                f"actoffload: {name} needs manual_synchronization=True")

    def start_offload_layer(self, layer_id):
        self._manual_only("start_offload_layer")
        self._context._core.start_offload(layer_id)

    def release_activation_forward_gpu_memory(self, layer_id):
        self._manual_only("release_activation_forward_gpu_memory")
        self._context._core.release_forward_memory(layer_id)

    def start_reload_layer(self, layer_id):
        self._manual_only("start_reload_layer")
        self._context._core.start_reload(layer_id)


def get_cpu_offload_context(enabled=False, num_layers=1, model_layers=1,
                            offload_activations=True, offload_weights=False,
                            double_buffering=False, manual_synchronization=False,
                            retain_pinned_cpu_buffers=False, offload_stream=None,
                            *, min_offload_size=256 * 1024, backend=None,
                            session=None):
    """TE's get_cpu_offload_context, on the C++ engine.

    Returns (context, sync_function); with manual_synchronization,
    (context, sync_function, synchronizer), where both the sync function and
    the synchronizer offer start_offload_layer, release_activation_forward_
    gpu_memory and start_reload_layer. Disabled (or with nothing to
    offload): a null context and an identity.
    Extensions: min_offload_size (elements; SPEC §1.2), backend ("cuda",
    "sim"), session (share one backend between offloaders).
    """
    if offload_weights:
        warnings.warn("actoffload: offload_weights is not supported (weights "
                      "stay on the device, SPEC §1.2); offloading activations only")
    if double_buffering:
        warnings.warn("actoffload: double_buffering has no effect (pinned "
                      "buffers are pooled; see retain_pinned_cpu_buffers)")
    if not enabled or not offload_activations:
        identity = SyncFunction(_NullSync(), manual_synchronization)
        if manual_synchronization:
            return contextlib.nullcontext(), identity, identity
        return contextlib.nullcontext(), identity
    if offload_stream is not None:
        if not manual_synchronization:
            raise _common.ext().OffloadError(
                "actoffload: offload_stream needs manual_synchronization=True")
        warnings.warn("actoffload: the engine copies on its own stream; "
                      "offload_stream is not used (its synchronize() is not "
                      "needed before release_activation_forward_gpu_memory)")
    if session is None:
        session = _common.new_session(backend)
    core = _common.ext().LayerOffloader(
        session, enabled=True, model_layers=model_layers,
        offloaded_layers=0 if manual_synchronization else num_layers,
        manual=manual_synchronization, retain=retain_pinned_cpu_buffers,
        min_offload_elements=min_offload_size)
    context = CpuOffloadContext(session, core, min_offload_size)
    sync = SyncFunction(context, manual_synchronization)
    if manual_synchronization:
        return context, sync, sync
    return context, sync


class _NullSync:
    """The disabled context's sync: identity, manual calls no-ops."""

    class _Core:
        def start_offload(self, layer):
            pass

        release_forward_memory = start_reload = start_offload

    _core = _Core()

    def _sync(self, tensor):
        return tensor
