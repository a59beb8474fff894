"""The memory budget on batches longer than the one it profiled (SPEC §7.8).

Dynamic padding feeds batches of many lengths; the budget's profile and
race measure the first one's (budget.SHAPE_PATIENCE). After the warm-up, a
batch longer than every earlier one gets a plan made for its size: the
engine's (_C.JointRace.for_length, engine/plan/joint_length.h: the race's
units and the bytes beside them grown by the ratio, within the same
budget). It serves every batch from then on.

Where the batch is seen:
  - at the forward's first module call that takes a tensor positionally
    (a Hugging Face model's embedding gets input_ids so, as does a
    torchtune model): a global forward pre-hook, in force from the
    context's enter to that call. Its size against the same call's in the
    profile gives the ratio before any unit has run, and the context sets
    this forward up again under the new plan (OffloadActivations.
    _plan_changed). Where that first call is a unit's own, its hooks have
    already been read, so the plan waits for the next forward;
  - at the first unit (its input's bytes against the profile's), which
    catches what the first call did not: the plan then starts with the
    next forward.
Where no plan fits the budget at that size, a warning names the least
budget that does, and the plan for it runs.
"""

import warnings

import torch

from . import _common


class LongerBatches:
    """The plans of a JointBudget (`budget`) for batches longer than its profile's."""

    def __init__(self, budget):
        self.budget = budget
        self.longest = 1.0   # the longest batch planned for, to the profiled one
        self._pending = None  # a plan made for it, not yet in force
        self._handle = None   # the first-call hook, while it waits
        self._changed = None  # what the context does when the plan changes now

    def take_pending(self):
        """The plan made for a longer batch and not yet applied, or None."""
        plan, self._pending = self._pending, None
        return plan

    # --- the forward's first call -------------------------------------------------
    def watch(self, changed):
        """At the context's enter: hooks the forward's first module call.
        `changed()` sets the forward up again where a new plan is pending."""
        self.unwatch()
        self._changed = changed
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(
            _common.eagerly(self._first_call))

    def unwatch(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _first_call(self, module, args):
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if tensor is None or _common.in_backward():
            return None  # a call by keywords only: the next one is looked at
        self.unwatch()
        record = self.budget._record
        if record is not None:
            record["first_numel"] = tensor.numel()  # the profile's, once kept
            return None
        reference = self._reference("first_numel")
        if reference and self._plan(tensor.numel() / reference):
            if any(module is unit for unit in self.budget.units):
                return None  # its hooks are read already: from the next forward
            self._changed()
        return None

    # --- the first unit -----------------------------------------------------------
    def at_first_unit(self, args, kwargs):
        """The first unit begins, not measured: its input against the profile's."""
        tensor = next((t for t in list(args) + list(kwargs.values())
                       if isinstance(t, torch.Tensor)), None)
        reference = self._reference("input")
        if tensor is not None and reference:
            self._plan(tensor.numel() * tensor.element_size() / reference)

    # --- planning -----------------------------------------------------------------
    def _reference(self, key):
        """The profile's figure `key` (its first unit's for "input"), or
        None before the warm-up's end."""
        budget = self.budget
        if budget._race is None or not budget._profiles or budget.measuring:
            return None
        figure = budget._profiles[0].get(key)
        return figure[0] if key == "input" else figure

    def _plan(self, ratio):
        """Plans for a batch `ratio` times the profiled one's size if it is
        the longest yet; whether a plan of other choices is now pending."""
        if ratio <= self.longest:
            return False
        self.longest = ratio
        plan = self.budget._race.for_length(ratio)
        if plan["needs_budget"]:
            warnings.warn(
                f"actoffload: a batch {ratio:.2f} times the profiled one's size needs a "
                f"budget of at least {plan['needs_budget']} bytes, and the budget is "
                f"{self.budget.budget_bytes}; every batch from now on runs the plan for "
                "that least budget", stacklevel=4)
        if plan["choice"] == self.budget.plan["choice"]:
            self._pending = None
            self.budget.plan = plan
            return False
        self._pending = plan
        return True
