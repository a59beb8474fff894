"""torchtune's helpers around its OffloadActivations, drop-in: NoOpManager
(saved tensors inside it stay on device) and its recipes'
get_act_offloading_ctx_manager.

    ctx = get_act_offloading_ctx_manager(model, True)   # torchtune's recipes
"""

import contextlib
import warnings

import torch

from .whole_model import OffloadActivations, find_layers


class NoOpManager(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors inside it stay as they are, even inside an offloading
    context (torchtune's NoOpManager: the innermost hooks win)."""

    def __init__(self):
        super().__init__(lambda tensor: tensor, lambda tensor: tensor)


def get_act_offloading_ctx_manager(model, enable_activation_offloading,
                                   use_streams=True):
    """torchtune's recipe helper: disabled, a null context; enabled, an
    OffloadActivations over the model's layer stack (find_layers; the
    whole forward if it has none) whose output head
    (`model.output`, or a TiedLinear's `.linear`) runs under a NoOpManager,
    as torchtune's does."""
    if not enable_activation_offloading:
        return contextlib.nullcontext()
    try:
        layers = find_layers(model)
    except ValueError:
        layers = None
    context = OffloadActivations(use_streams=use_streams, layers=layers,
                                 model=model)
    output = getattr(model, "output", None)
    if output is not None and not isinstance(output, torch.nn.Module):
        output = getattr(output, "linear", None)  # torchtune's TiedLinear
    if isinstance(output, torch.nn.Module):
        noop = NoOpManager()
        output.register_forward_pre_hook(lambda *args: noop.__enter__())
        output.register_forward_hook(lambda *args: noop.__exit__(None, None, None))
    elif hasattr(model, "decoder") and output is None:
        raise NotImplementedError(
            "Multimodal model does not support activation offloading yet. "
            "Please set enable_activation_offloading=False")
    else:
        warnings.warn("actoffload: no output head (model.output) was found; "
                      "its activations are offloaded with the rest", stacklevel=2)
    return context
