"""Megatron-LM's fine-grained groups (SPEC §5.1) on Hugging Face decoder
layers, placed with module hooks, for a FineGrainedOffloader:

    fg = FineGrainedOffloader(["attn_norm", "core_attn", "mlp_norm"])
    handles = attach_groups(fg, model.model.layers)
    with fg.chunk(stage, microbatch):   # a pipeline stage's forward
        out = stage_module(x)

Per decoder layer (Llama, Qwen2, Qwen2-MoE, Mistral: input_layernorm,
self_attn with q/k/v/o_proj, post_attention_layernorm, mlp), nested as in
Megatron's transformer layer:

    attn_norm   from input_layernorm's input to the attention's residual add
                (input_layernorm, and the three groups below)
      qkv_linear   from input_layernorm's output through q_proj, k_proj, v_proj
      core_attn    from v_proj's output to o_proj's input (RoPE, the
                   attention kernel)
      attn_proj    o_proj
    mlp_norm    from the residual add to the layer's output
                (post_attention_layernorm and the MLP)
      expert_fc1   a mixture of experts' expert bank (`mlp.experts`, as
                   Qwen2-MoE and Mixtral have it): its input to its output.
                   Transformers 5 runs every expert's fc1, activation and fc2
                   inside that one module, so Megatron's moe_act (the
                   activation alone) has no boundary to hook and is not placed.

Each boundary is an identity on the tensor that crosses it (group_start and
group_commit). A group's backward starts where the gradient reaches its
committed output and ends where it reaches its input; Hugging Face computes
q, k and v projections before RoPE, and autograd runs later-made nodes first,
so every tensor a group saved is popped inside its backward (the engine
raises otherwise). The hooks do nothing outside a chunk's forward (eval,
no_grad, a checkpoint's recompute).
"""

import torch

from . import _common

GROUPS = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
MOE_GROUPS = GROUPS + ("expert_fc1",)  # on layers whose mlp has `experts`


def attach_groups(fg, layers):
    """Places GROUPS on each decoder layer in `layers` (a ModuleList or a
    list). Returns the hook handles (call .remove() on each to detach).
    Raises ValueError naming the layer and the submodule it lacks."""
    handles = []
    for index, layer in enumerate(layers):
        handles.extend(_Placement(fg, layer, index).handles)
    return handles


class _Hook:
    """One of a placement's module hooks, run outside torch.compile's
    graphs (_common.eagerly). A copy of the module (copy.deepcopy: an EMA
    model, AveragedModel; torch.save(model)) gets a hook that places nothing:
    the offloader cannot be copied, and the copy is not the model it was
    attached to."""

    __slots__ = ("hook",)

    def __init__(self, hook):
        self.hook = _common.eagerly(hook)

    def __call__(self, *args):
        return self.hook(*args)

    def __reduce_ex__(self, protocol):
        return _no_placement, ()


def _no_placement():
    """What a copied _Hook becomes."""
    return _places_nothing


def _places_nothing(*args):
    return None


class _Placement:
    """The hooks of one decoder layer."""

    def __init__(self, fg, layer, index):
        self.fg = fg
        self.on = False
        attn = getattr(layer, "self_attn", None)
        for owner, name in ((layer, "self_attn"), (layer, "input_layernorm"),
                            (layer, "post_attention_layernorm"), (attn, "v_proj"),
                            (attn, "o_proj")):
            if owner is None or not isinstance(getattr(owner, name, None), torch.nn.Module):
                raise ValueError(
                    f"actoffload: decoder layer {index} ({type(layer).__name__}) has no "
                    f"{name} submodule; attach_groups places Megatron's groups on "
                    "Llama-style layers (input_layernorm, self_attn.q/k/v/o_proj, "
                    "post_attention_layernorm)")
        hook = _Hook
        self.handles = [
            layer.input_layernorm.register_forward_pre_hook(hook(self._layer_in)),
            layer.input_layernorm.register_forward_hook(hook(self._attn_in)),
            attn.v_proj.register_forward_hook(hook(self._v_out)),
            attn.o_proj.register_forward_pre_hook(hook(self._o_in)),
            attn.o_proj.register_forward_hook(hook(self._o_out)),
            layer.post_attention_layernorm.register_forward_pre_hook(hook(self._mlp_in)),
            layer.register_forward_hook(hook(self._layer_out)),
        ]
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if isinstance(experts, torch.nn.Module):
            self.handles += [experts.register_forward_pre_hook(hook(self._experts_in)),
                             experts.register_forward_hook(hook(self._experts_out))]
        self.experts_on = False

    def _between(self, tensor, commit, start):
        """Commits group `commit` and opens `start` on the tensor (either
        may be None), if this layer's forward places groups."""
        if not self.on:
            return tensor
        if commit is not None:
            tensor = self.fg.group_commit(tensor, commit)
        if start is not None:
            tensor = self.fg.group_start(tensor, start)
        return tensor

    def _layer_in(self, module, args):
        hidden = args[0]
        # Decided once per forward of the layer, so that its groups open and
        # commit in pairs: inside a chunk, with grad, on a hidden state that
        # requires grad (as Megatron's do).
        self.on = (self.fg.in_chunk and torch.is_grad_enabled() and
                   isinstance(hidden, torch.Tensor) and hidden.requires_grad)
        return (self._between(hidden, None, "attn_norm"),) + tuple(args[1:])

    def _attn_in(self, module, args, out):
        return self._between(out, None, "qkv_linear")

    def _v_out(self, module, args, out):
        return self._between(out, "qkv_linear", "core_attn")

    def _o_in(self, module, args):
        return (self._between(args[0], "core_attn", "attn_proj"),) + tuple(args[1:])

    def _o_out(self, module, args, out):
        return self._between(out, "attn_proj", None)

    def _mlp_in(self, module, args):
        return (self._between(args[0], "attn_norm", "mlp_norm"),) + tuple(args[1:])

    def _experts_in(self, module, args):
        # (An expert bank called with keyword arguments only gets no group.)
        self.experts_on = self.on and bool(args) and isinstance(args[0], torch.Tensor)
        if not self.experts_on:
            return None
        return (self._between(args[0], None, "expert_fc1"),) + tuple(args[1:])

    def _experts_out(self, module, args, out):
        if not self.experts_on:
            return out
        self.experts_on = False
        if isinstance(out, tuple):
            return (self._between(out[0], "expert_fc1", None),) + out[1:]
        return self._between(out, "expert_fc1", None)

    def _layer_out(self, module, args, out):
        if isinstance(out, tuple):
            out = (self._between(out[0], "mlp_norm", None),) + out[1:]
        else:
            out = self._between(out, "mlp_norm", None)
        self.on = False
        return out
