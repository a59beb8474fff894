"""The forwards of the units a budget recomputes (budget.py): a wrapper
that runs a unit under torch.utils.checkpoint where its budget's plan says
so, and the unit's own forward elsewhere."""

import torch
import torch.utils.checkpoint

from . import _common


def compiled(unit):
    """Whether `unit.compile()` compiled it. Such a unit is kept or
    offloaded, never recomputed: torch.utils.checkpoint around its forward
    saves a different set of tensors when the compiled forward runs than
    when the backward re-runs it, and refuses the re-run."""
    return getattr(unit, "_compiled_call_impl", None) is not None


def restore_forward(unit):
    """Takes the budgets' wrappers off `unit`: its forward is again what it
    was before the first (its class's, or what the caller had set)."""
    own = unit.__dict__.get("forward")
    while isinstance(own, Checkpointed):
        own = own.forward
    if getattr(own, "__self__", None) is unit and \
            getattr(own, "__func__", None) is type(unit).forward:
        del unit.forward
    else:
        unit.forward = own


class Checkpointed:
    """A recomputed unit's forward: torch.utils.checkpoint (non-reentrant,
    RNG state preserved) around the unit's own forward where its budget says
    so (JointBudget.checkpoints) and, in a backward, where the forward it
    re-runs did (an outer checkpoint's re-run must save what the forward
    saved); the unit's own forward elsewhere."""

    def __init__(self, budget, index, forward):
        self.budget, self.index, self.forward = budget, index, forward
        self.checkpointed = False  # what its last forward (with grad) did

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        if not _common.in_backward():
            self.checkpointed = self.budget.checkpoints(self.index)
        if not self.checkpointed:
            return self.forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(
            self.forward, *args, use_reentrant=False, **kwargs)
