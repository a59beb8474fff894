"""A context manager around a whole forward (torchtune's usage), with the
byte budget of SPEC §4.7:

    with OffloadActivations(model, budget_bytes=4 << 30):
        loss = model(x).loss
    loss.backward()

Layers come from the caller (`layers`: a list of modules, or a model whose
longest nn.ModuleList is its layer stack) or, with a byte budget and no
layers, from the hooks' order: the whole forward is one unit, and the
engine's plan decides per saved storage (in the order the pack hooks saw
them) what goes to host and when it comes back. Each listed layer's forward
is an engine ForwardStep (module pre-hook); its output's backward is its
BackwardStep; the end of the backward pass is FinishBackward. Tensors saved
outside the listed layers (embeddings, the head, the loss) stay on device.
"""

import torch

from . import _common


def find_layers(model):
    """The longest nn.ModuleList in `model`: a transformer's layer stack
    (Llama's model.layers, GPT-2's transformer.h)."""
    best = None
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and (
                best is None or len(module) > len(best)):
            best = module
    if best is None or len(best) == 0:
        raise ValueError("actoffload: no nn.ModuleList of layers found in the "
                         "model; pass layers=[...] or use budget_bytes without layers")
    return list(best)


def _map_first_tensor(output, fn):
    """Applies fn to the first tensor that requires grad in a module's
    output (a tensor, or a tuple/list starting with one)."""
    if isinstance(output, torch.Tensor):
        return fn(output) if output.requires_grad else output
    if isinstance(output, (tuple, list)) and output:
        first = output[0]
        if isinstance(first, torch.Tensor) and first.requires_grad:
            return type(output)([fn(first), *output[1:]])
    return output


class OffloadActivations:
    """Offloads the activations of a whole forward through the C++ engine.

    layers: modules (the layer stack), a model (its longest ModuleList), or
      None (only with budget_bytes: the whole forward is one unit).
    num_layers: offload the first k of the n layers (TE's default schedule);
      default n - 1 when no budget is given.
    budget_bytes: keep the device bytes of offloadable saved tensors within
      this budget (SPEC §4.7); the first iteration runs without offloading
      and is recorded, later ones follow the plan made from it.
    min_offload_size: tensors with fewer elements stay on device.
    retain_pinned_buffers: keep pinned host buffers between iterations.
    backend / session: as for get_cpu_offload_context.
    """

    def __init__(self, layers=None, *, num_layers=None, budget_bytes=None,
                 min_offload_size=256 * 1024, retain_pinned_buffers=False,
                 backend=None, session=None):
        if isinstance(layers, torch.nn.Module) and not isinstance(
                layers, torch.nn.ModuleList):
            layers = find_layers(layers)
        self._layers = list(layers) if layers is not None else None
        if self._layers is None and budget_bytes is None:
            raise ValueError("actoffload: OffloadActivations needs layers (or a "
                             "model) for k-of-n offloading, or budget_bytes")
        n = len(self._layers) if self._layers is not None else 1
        if n == 0:
            raise ValueError("actoffload: an empty list of layers")
        if num_layers is None:
            num_layers = max(n - 1, 0)
        self.session = session if session is not None else _common.new_session(backend)
        self.offloader = _common.ext().LayerOffloader(
            self.session, model_layers=n, offloaded_layers=num_layers,
            retain=retain_pinned_buffers, min_offload_elements=min_offload_size,
            budget_bytes=budget_bytes)
        self._filter = _common.SavedTensorFilter(self.session, self.offloader,
                                                 min_offload_size)
        self._whole_forward = self._layers is None
        self._budget = budget_bytes is not None
        self._pack_into = self._filter.pack
        self._in_layer = False
        self._layer_offloaded = True
        self._handles = []
        self._hooks = None
        self._backward = _common.LayerBackward(self.offloader)
        self._active = False

    # --- hooks ---------------------------------------------------------------
    def _pack(self, tensor):
        if not self._in_layer or not self._layer_offloaded:
            return _common.keep(tensor)
        return self._pack_into(tensor)

    def _unpack(self, packed):
        if self._whole_forward and not self._backward.begun:
            self._backward.step(0)
        return self._filter.unpack(packed)

    def _pre_hook(self, index):
        def hook(module, args):
            layer = self.offloader.forward_step()
            if layer != index:
                raise _common.ext().OffloadError(
                    f"actoffload: layer {index} ran as the engine's layer {layer}; "
                    "the listed layers must run once each, in order")
            # The byte budget records every push of its first iteration.
            self._layer_offloaded = self._budget or self.offloader.will_offload(layer)
            self._in_layer = True
        return hook

    def _post_hook(self, index):
        def hook(module, args, output):
            self._in_layer = False
            return _map_first_tensor(
                output, lambda t: _common.BackwardStepAt.apply(t, self._backward, index))
        return hook

    # --- context -------------------------------------------------------------
    def __enter__(self):
        if self._active:
            raise _common.ext().OffloadError(
                "actoffload: OffloadActivations entered again inside its forward")
        if not torch.is_grad_enabled():
            self._hooks = None
            self._active = True
            return self
        _common.check_stream(self.session)
        self._active = True
        if self._whole_forward:
            self.offloader.forward_step()
            self._in_layer = True
            self._layer_offloaded = True
        else:
            for index, layer in enumerate(self._layers):
                self._handles.append(layer.register_forward_pre_hook(self._pre_hook(index)))
                self._handles.append(layer.register_forward_hook(self._post_hook(index)))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._in_layer = False
        if self._hooks is not None:
            hooks, self._hooks = self._hooks, None
            hooks.__exit__(*exc)
        return False

    def budget_plan(self):
        """The byte budget's plan as a table (empty before it is made)."""
        return self.offloader.budget_plan_text()
