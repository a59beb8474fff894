"""The memory budget on batches longer than the one it profiled (SPEC §7.8).

Dynamic padding feeds batches of many lengths; the budget's profile and
race measure the first one's (budget.SHAPE_PATIENCE). After the warm-up, a
batch longer than every earlier one gets a plan made for its size: the
engine's (_C.JointRace.for_length, engine/plan/joint_length.h: the race's
units and the bytes beside them grown by the ratio, within the same
budget). It serves every batch from then on.

Where the batch is seen (after the warm-up only):
  - at the forward's first module call that takes a tensor positionally
    (a Hugging Face model's embedding gets input_ids so, as does a
    torchtune model): a global forward pre-hook, in force from the
    context's enter to that call. Its size against what that call took
    for a batch of the profiled size (the first forward after the warm-up
    tells, with the first unit's input) gives the ratio before any unit
    has run, and the context sets this forward up again under the new
    plan (OffloadActivations._plan_changed). Where that first call is a
    unit's own, its hooks have already been read, so the plan waits for
    the next forward. No such hook is put up where a unit or a module of
    the model is compiled: under torch.compile a hook in force changes what
    dynamo traces, and a model compiled whole ran other kernels (7.0010 for
    7.0009: run 96);
  - at the first unit (its input's bytes against the profile's), which
    catches what the first call did not: the plan then starts with the
    next forward.
Where no plan fits the budget at that size, a warning names the least
budget that does, and the plan for it runs.
"""

import threading
import warnings

import torch

from . import _common, recompute


class LongerBatches:
    """The plans of a JointBudget (`budget`) for batches longer than its profile's."""

    def __init__(self, budget):
        self.budget = budget
        self.longest = 1.0    # the longest batch planned for, to the profiled one
        self._pending = None  # a plan made for it, not yet in force
        self._handle = None   # the first-call hook, while it waits
        self._changed = None  # what the context does when the plan changes now
        self._thread = None   # the thread whose forward the hook waits for
        self._first = None    # the size the first call took in this forward
        self._reference = None  # what it takes for a batch of the profiled size
        self._compiled = None   # whether a unit or a module of the model is compiled

    def pending_is_lean(self):
        """Whether the pending plan runs without the engine (budget.LEAN)."""
        return self._pending is not None and self.budget.runs_lean(self._pending)

    def take_pending(self):
        """The plan made for a longer batch and not yet applied, or None."""
        plan, self._pending = self._pending, None
        return plan

    # --- the forward's first call -------------------------------------------------
    def watch(self, changed):
        """At the context's enter, after the warm-up: hooks the forward's
        first module call. `changed()` sets the forward up again where a
        new plan is pending, and says whether it could (else the plan
        stays pending for the next forward)."""
        self.unwatch()
        self._first = None
        if self._profiled() is None:
            return
        if self._compiled is None:  # the model's modules (where given) and the units
            self._compiled = any(recompute.compiled(m)
                                 for root in self.budget.owner.model_modules() + self.budget.units
                                 for m in root.modules())
        if self._compiled:
            return
        self._changed = changed
        self._thread = threading.get_ident()
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(
            _common.eagerly(self._first_call))

    def unwatch(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _first_call(self, module, args):
        if threading.get_ident() != self._thread:
            return None  # a global hook: another thread's module (an evaluation's)
        tensor = _common.first_tensor(args)
        if tensor is None or _common.in_backward():
            return None  # a call by keywords only: the next one is looked at
        self.unwatch()
        self._first = tensor.numel()
        if self._reference and self._plan(self._first / self._reference):
            if any(module is unit for unit in self.budget.units):
                return None  # its hooks are read already: from the next forward
            self._changed()  # (or, where it cannot set the forward up again, the next)
        return None

    # --- the first unit -----------------------------------------------------------
    def at_first_unit(self, args, kwargs):
        """The first unit begins, after the warm-up: its input against the
        profile's (and, the first time, what the first call took for a
        batch of the profiled size)."""
        tensor = _common.first_tensor(args, kwargs)
        profiled = self._profiled()
        if tensor is None or not profiled:
            return
        ratio = _common.tensor_bytes(tensor) / profiled
        if self._reference is None and self._first:
            self._reference = self._first / ratio
        self._plan(ratio)

    # --- planning -----------------------------------------------------------------
    def _profiled(self):
        """The first unit's input bytes in the profile, or None before the
        warm-up's end."""
        budget = self.budget
        if budget._race is None or not budget._profiles or budget.measuring:
            return None
        return budget._profiles[0]["input"][0]

    def _plan(self, ratio):
        """Plans for a batch `ratio` times the profiled one's size if it is
        the longest yet; whether a plan of other choices is now pending."""
        if ratio <= self.longest:
            return False
        self.longest = ratio
        try:
            plan = self.budget._race.for_length(ratio)
        except (RuntimeError, ValueError) as error:  # the engine's Status
            warnings.warn(f"actoffload: no plan for a batch {ratio:.2f} times the profiled "
                          f"one's size ({error}); the plan in force runs", stacklevel=4)
            return False
        if plan["needs_budget"]:
            warnings.warn(
                f"actoffload: a batch {ratio:.2f} times the profiled one's size needs a "
                f"budget of at least {plan['needs_budget']} bytes, and the budget is "
                f"{self.budget.budget_bytes}; every batch from now on runs the plan for "
                "that least budget", stacklevel=4)
        if plan["choice"] == self.budget.plan["choice"]:
            self._pending = None
            self.budget._apply(plan)  # the same choices: only its figures change
            return False
        self._pending = plan
        return True
