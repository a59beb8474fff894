"""torchtune's activation offloading, drop-in (OffloadActivations; its
NoOpManager and get_act_offloading_ctx_manager are in torchtune_compat.py),
on the engine's TrainingLoop (SPEC §4.7, §7):

    with OffloadActivations():             # torchtune's usage
        loss = model(x).loss
    loss.backward()

    ctx = get_act_offloading_ctx_manager(model, True)   # torchtune's recipes

What is offloaded and when:
  - no layers given (torchtune's own usage): every activation saved inside
    the context is offloaded under the smallest byte budget the engine can
    keep (SPEC §4.7): the first iteration runs on device and is recorded,
    later ones move each saved storage to host as early, and back as late,
    as the budget allows;
  - layers given (a list of modules, or a model: its layer stack, find_layers),
    as get_act_offloading_ctx_manager does with the model: the first k of n
    layers (default n - 1) are offloaded from the first iteration on, TE's
    default schedule; tensors saved outside the layers stay on device;
  - budget_bytes: the byte budget, with or without layers.
Each listed layer's forward is an engine forward step (module pre-hook);
the gradient reaching its output begins its backward (a tensor hook); the
backward pass's end ends the iteration, whatever it reached.
"""

import warnings

import torch

from . import _common, budget, recompute

# Module pre-hooks that see keyword arguments (torch >= 2.0).
_KWARGS_HOOKS = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 0)


def find_layers(model):
    """The model's layer stack: its longest nn.ModuleList that is not inside
    another ModuleList's modules (Llama's model.layers, GPT-2's
    transformer.h; not a mixture-of-experts layer's own list of experts,
    however many it has). An encoder-decoder (T5, BART, Whisper) has two:
    every such list as long as the longest whose layers are as large (at
    least half its parameters per layer) joins it, in the order the model
    registers them, which is the order they run. A list of per-layer norms
    kept beside the layers does not (its layers run interleaved with them)."""
    inner = set()
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for child in module:
                inner.update(id(m) for m in child.modules()
                             if isinstance(m, torch.nn.ModuleList))
    tops = [m for m in model.modules()
            if isinstance(m, torch.nn.ModuleList) and id(m) not in inner and len(m) > 0]
    if not tops:
        raise ValueError("actoffload: no nn.ModuleList of layers found in the "
                         "model; pass layers=[...] or use budget_bytes without layers")
    best = max(tops, key=len)  # the first of the longest

    def per_layer(stack):
        return sum(p.numel() for p in stack.parameters()) / len(stack)

    stacks = [m for m in tops if m is best or (
        len(m) == len(best) and per_layer(m) > 0 and per_layer(m) >= per_layer(best) / 2)]
    return [layer for stack in stacks for layer in stack]


class OffloadActivations:
    """Offloads activations through the C++ engine; torchtune's signature,
    defaults and meaning, plus keyword-only extensions.

    use_pin_memory: host copies are pinned (always; False warns).
    use_streams: copies overlap compute on streams of their own (always;
      False warns: the engine has no same-stream mode).
    max_fwd_stash_size: torchtune's check (>= 1 with streams); the engine
      releases device memory when its schedule or budget says.
    min_offload_size: bytes (torchtune's 1024): smaller tensors stay.
    layers: modules (the layer stack), a model (its stack: find_layers), or
      None (the whole forward is one unit under a byte budget).
    num_layers: offload the first k of the n layers (default n - 1).
    budget_bytes: with layers on a CUDA device (or a `probe`), the step's
      peak as the user measures it: torch.cuda.max_memory_allocated()
      above the memory allocated before the forward (SPEC §7.8). Each unit
      is kept, offloaded or recomputed by the joint plan (budget.py, SPEC
      §4.8), made from a profile of the first iterations and a race of
      close plans in the next ones; budget_plan() prints it. A budget no
      plan can meet raises ValueError once, at the next forward, naming
      the smallest that fits, which is then planned. Without a probe (no
      layers, or CPU layers): the engine's byte budget over the device
      bytes of offloadable saved tensors (SPEC §4.7); default with no
      layers: the smallest the engine can keep.
    budget_fraction: the budget as a share, in (0, 1], of the step's
      no-offload peak, measured by the profile (instead of budget_bytes).
    granularity: the budget's units: "layer" (each of `layers`), or "block"
      (each layer's attention and MLP blocks, where they hold most of its
      parameters; budget_units.find_units).
    allow_offload, allow_recompute: which choices the joint plan may make
      (allow_offload=False: recompute only, checkpointing planned per unit;
      allow_recompute=False: offload only).
    probe: the device memory the budget reads (allocated(), peak(),
      reset_peak(); probe.MemoryProbe on CUDA, the default there); a test's
      scripted one on the simulated GPU.
    model: a module whose parameters and buffers are never offloaded, beside
      those of `layers` (SPEC §7.5).
    retain_pinned_buffers, backend, session: as get_cpu_offload_context.
    """

    def __init__(self, use_pin_memory=True, use_streams=None,
                 max_fwd_stash_size=5, min_offload_size=1024, *, layers=None,
                 num_layers=None, budget_bytes=None, retain_pinned_buffers=False,
                 model=None, backend=None, session=None, budget_fraction=None,
                 granularity="layer", allow_offload=True, allow_recompute=True,
                 probe=None):
        if isinstance(use_pin_memory, (torch.nn.Module, list, tuple)):
            # The package's earlier first argument: the layers.
            layers, use_pin_memory = use_pin_memory, True
        if use_streams is not False and max_fwd_stash_size < 1:
            raise ValueError(f"max_fwd_stash_size should be at least 1 but is "
                             f"{max_fwd_stash_size}")
        if not use_pin_memory:
            warnings.warn("actoffload: host copies are always pinned "
                          "(use_pin_memory=False has no effect)", stacklevel=2)
        if use_streams is False:
            warnings.warn("actoffload: copies always run on streams of their "
                          "own (use_streams=False has no effect)", stacklevel=2)
        if min_offload_size < 0:
            raise ValueError(f"min_offload_size must be >= 0, got {min_offload_size}")
        # Modules whose parameters and buffers are never offloaded (SPEC
        # §7.5): the model or layers given, and model= (the whole model).
        self._modules = [m for m in ([model] if model is not None else [])]
        if isinstance(layers, torch.nn.Module):
            self._modules.append(layers)
        elif layers is not None:
            self._modules.extend(m for m in layers if isinstance(m, torch.nn.Module))
        if isinstance(layers, torch.nn.Module) and not isinstance(
                layers, torch.nn.ModuleList):
            layers = find_layers(layers)
        self._layers = list(layers) if layers is not None else None
        if self._layers is not None and len(self._layers) == 0:
            raise ValueError("actoffload: an empty list of layers")
        if budget_fraction is not None and not 0 < budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
        if budget_fraction is not None and budget_bytes is not None:
            raise ValueError("give budget_bytes or budget_fraction, not both")
        self._units = self._layers
        self._joint = None
        joint_probe = None
        if self._layers is not None and (budget_bytes is not None or
                                         budget_fraction is not None):
            joint_probe = budget.default_probe(self._layers, probe)
            if joint_probe is None and budget_fraction is not None:
                raise ValueError("actoffload: budget_fraction needs a device memory "
                                 "probe (CUDA layers, or probe=)")
        if joint_probe is not None:
            self._units = budget.find_units(self._layers, granularity)
        n = len(self._units) if self._units is not None else 1
        if budget_bytes is None and self._layers is None:
            budget_bytes = 1  # planned up to the smallest that fits
            smallest = True
        else:
            smallest = False
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        if num_layers is None:
            num_layers = max(n - 1, 0)
        if budget_bytes is None and not 0 <= num_layers <= n - 1:
            raise ValueError(f"num_layers must be in [0, {n - 1}] for {n} layers, "
                             f"got {num_layers}")
        self.min_offload_size = min_offload_size
        self.session = session if session is not None else _common.new_session(backend)
        if joint_probe is not None:
            # The budget as the user measures it, planned jointly (budget.py).
            def make_loop(schedule):
                return _common.ext().TrainingLoop(
                    self.session, model_layers=n, offloaded_layers=0,
                    retain=retain_pinned_buffers, min_offload_bytes=min_offload_size,
                    schedule=schedule or None)
            self.offloader = make_loop(None)
            bandwidths = (budget.copy_bandwidths(self.session.device)
                          if isinstance(joint_probe, budget.MemoryProbe)
                          else (55.0, 55.0))  # SPEC §8's pinned bandwidth
            self._joint = budget.JointBudget(
                self, self._units, budget_bytes, budget_fraction, joint_probe,
                allow_offload, allow_recompute, bandwidths, make_loop)
        else:
            self.offloader = _common.ext().TrainingLoop(
                self.session, model_layers=n,
                offloaded_layers=num_layers if budget_bytes is None else 0,
                retain=retain_pinned_buffers, min_offload_bytes=min_offload_size,
                budget_bytes=budget_bytes, smallest_budget=smallest)
        # Whether the engine says per unit, as it begins, if it offloads it
        # (a budget's plan, TE's schedule of layers), so that its hooks are
        # in force inside those units only; a byte budget decides per storage.
        self._per_unit = self._layers is not None and (
            self._joint is not None or budget_bytes is None)
        self._model_tensors_set = False  # in this forward
        self._handles = []
        self._hooks = None
        self._unit_hooks = None  # the budget's hooks per offloaded unit (_common.UnitHooks)
        self._unit_hook_fns = None  # each unit's (pre, post) module hooks
        self._batch_hook_fn = None  # the first unit's pre-hook in a lean forward
        self._first_end_fn = None  # and its forward hook
        self._top_at_enter = None  # the saved-tensor hooks in force at the enter
        self._active = False
        self._passthrough = False
        self._lean = False  # this forward runs without the engine (JointBudget.lean)
        self._refs = {}  # layer index -> (ref, engine layer) while it runs
        self._warned_without_grad = False
        self._whole_ref = None
        # _warn_if_unreached: whether something was reached in a forward of
        # this context (a unit began; without units, a tensor was offloaded)
        # or the warning given, so that nothing is left to check; how many
        # forwards reached nothing; the engine's pushes as this one began.
        self._reached = False
        self._unreached = 0
        self._pushes_before = None

    # --- module hooks (listed layers) -----------------------------------------
    def _pre_hook(self, index):
        def hook(module, args, kwargs=None):
            if _common.in_backward():
                return None  # a checkpoint's recompute: stays on device
            self._reached = True
            if not torch.is_grad_enabled():
                self._warn_without_grad(index)
                return None  # it saves nothing: no step of the engine's
            ref, layer, offloaded = self.offloader.forward_step(index)
            self._refs[index] = (ref, layer)
            if self._joint is not None:
                self._joint.unit_begins(index, args, kwargs or {})
            if self._unit_hooks is not None and offloaded:
                if not self._model_tensors_set and self._modules:
                    self.offloader.set_model_tensors(_module_tensors(self._modules))
                self._model_tensors_set = True
                self._unit_hooks.unit_begins(index, recompute.compiled(module))
            return None
        return _common.eagerly(hook)

    def _batch_hook(self):
        """A lean forward's only hook, on the first unit: the budget sees
        the batch's size (budget_lengths.LongerBatches.at_first_unit)."""
        def hook(module, args, kwargs=None):
            if torch.is_grad_enabled() and not _common.in_backward():
                self._joint.lengths.at_first_unit(args, kwargs or {})
            return None
        return _common.eagerly(hook)

    def _first_unit_end_hook(self):
        """A lean forward's hook at the first unit's end: the budget
        watches the pass's end (budget_edge.SteadyWatch)."""
        def hook(module, args, output):
            if torch.is_grad_enabled() and not _common.in_backward():
                self._joint.unit_ends(0, output)
            return None
        return _common.eagerly(hook)

    def _warn_without_grad(self, index):
        """Once per context: unit `index` ran with grad disabled inside
        the context's forward, where grad was enabled (a reentrant
        checkpoint around it runs its forward under no_grad)."""
        if self._warned_without_grad:
            return
        self._warned_without_grad = True
        warnings.warn(
            f"actoffload: layer {index} ran with grad disabled inside the forward (a "
            "reentrant torch.utils.checkpoint around it, as Hugging Face's "
            "gradient_checkpointing_enable() uses unless told use_reentrant=False): it "
            "saves nothing for backward, so nothing of it is offloaded, recomputed or "
            "measured; to checkpoint and offload together, checkpoint with "
            "use_reentrant=False", stacklevel=3)

    def _post_hook(self, index):
        def hook(module, args, output):
            running = self._refs.pop(index, None)
            if running is None:
                return None
            if self._unit_hooks is not None:
                self._unit_hooks.unit_ends(index)
            self.offloader.end_layer()
            if self._joint is not None:
                self._joint.unit_ends(index, output)
            ref, layer = running
            if ref is not None:
                _common.mark_layer_end(self.offloader, ref, layer, output)
            return None  # the output stays the very object the layer returned
        return _common.eagerly(hook)

    # --- context ---------------------------------------------------------------
    def __enter__(self):
        if self._active:
            raise RuntimeError(
                "actoffload: OffloadActivations entered again inside its forward")
        self._active = True
        if not torch.is_grad_enabled() or _common.in_backward():
            self._passthrough = True
            return self
        _common.check_stream(self.session)
        _common.end_stale_pass(self.offloader)
        if self._joint is not None:
            try:
                self._joint.begin_forward()  # a refusal is raised here, once
            except BaseException:
                self._active = False
                raise
        if self._joint is not None:
            self._top_at_enter = _common.saved_hooks_top()
            self._joint.lengths.watch(self._plan_changed)
        try:
            self._set_up_forward()
        except BaseException:
            self._active = False  # refused (SPEC §7.8): nothing entered
            if self._joint is not None:
                self._joint.lengths.unwatch()
            raise
        return self

    def _set_up_forward(self):
        """What this forward runs under: the budget's lean plan (its
        recomputed units' wrappers), or the engine's hooks."""
        if self._joint is not None and self._joint.lean():
            # A settled plan that offloads nothing: only its recomputed
            # units' wrappers; the engine and its hooks sit this one out.
            self._lean = True
            self._joint.install()
            if self._batch_hook_fn is None:
                self._batch_hook_fn = self._batch_hook()
                self._first_end_fn = self._first_unit_end_hook()
            self._handles.append(_register_pre_hook(self._units[0], self._batch_hook_fn))
            self._handles.append(self._units[0].register_forward_hook(self._first_end_fn))
            return
        unit_hooks = self._per_unit and _common.saved_hooks_top() is not NotImplemented
        self._model_tensors_set = False
        self._pushes_before = (_common.pushes(self.offloader) if not self._reached and
                               self._layers is None and _common.compiled_anything() else None)
        if self._modules and not unit_hooks:
            self.offloader.set_model_tensors(_module_tensors(self._modules))
        if self._layers is None:
            # The whole forward is one unit; its reference is held while it
            # runs (the engine abandons a forward nothing holds).
            self._whole_ref = self.offloader.forward_step(0)[0]
        else:
            if self._unit_hook_fns is None:  # made once: wrapping them is not free
                self._unit_hook_fns = [(self._pre_hook(i), self._post_hook(i))
                                       for i in range(len(self._units))]
            for unit, (pre_fn, post_fn) in zip(self._units, self._unit_hook_fns):
                if self._joint is not None:
                    self._handles.append(_register_pre_hook(unit, pre_fn))
                else:
                    self._handles.append(unit.register_forward_pre_hook(pre_fn))
                self._handles.append(unit.register_forward_hook(post_fn))
            if self._joint is not None:
                self._joint.install()
        _common.emit_warnings(self.offloader)
        if unit_hooks:
            # The engine sees only what the offloaded units save.
            self._unit_hooks = _common.UnitHooks(self.offloader.pack,
                                                 self.offloader.unpack)
            return
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self.offloader.pack, self.offloader.unpack)
        self._hooks.__enter__()

    def _plan_changed(self):
        """A batch longer than any before it, seen before any unit began
        (budget_lengths.LongerBatches): this forward runs the plan made
        for it, under the hooks that plan needs; returns whether it does.
        Not where someone pushed saved-tensor hooks since the enter (a
        NoOpManager, save_on_cpu): theirs stay innermost, and the engine's
        set up again would take their place or sit above them. Where the
        torch version cannot say which hooks are in force (< 2.8), only a
        lean forward for a lean plan (wrappers, no hooks) is set up again.
        Otherwise the plan waits for the next forward."""
        if self._top_at_enter is NotImplemented:
            if not (self._lean and self._joint.lengths.pending_is_lean()):
                return False
        elif not _common.nobody_pushed_since(self._top_at_enter):
            return False
        self._take_down_forward(None, None, None)
        self._joint.apply_pending()
        self._set_up_forward()
        return True

    def __exit__(self, exc_type, exc, tb):
        self._active = False
        if exc_type is not None:
            _common.close_abandoned_checkpoints(tb)
        if self._passthrough:
            self._passthrough = False
            return False
        if self._joint is not None:
            self._joint.lengths.unwatch()
            if exc_type is not None:
                self._joint.forward_raised()
        if self._take_down_forward(exc_type, exc, tb):
            return False  # lean: the engine sat this forward out
        if exc_type is not None:
            self.offloader.abandon_forward()  # SPEC §7.2
        else:
            self.offloader.end_forward()
            self._warn_if_unreached()
        self._whole_ref = None
        _common.emit_warnings(self.offloader)
        return False

    def _take_down_forward(self, exc_type, exc, tb):
        """Undoes _set_up_forward; returns whether the forward was lean."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._joint is not None:
            self._joint.uninstall()
        if self._lean:
            self._lean = False
            return True
        self._refs.clear()
        if self._unit_hooks is not None:
            self._unit_hooks.close()
            self._unit_hooks = None
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(exc_type, exc, tb)
        return False

    def _warn_if_unreached(self):
        """Once per context, where nothing was ever reached, at a forward
        (grad enabled, no exception) that reached nothing: with units, the
        second in which no unit began; without units and with torch.compile
        in use, the first that followed a plan, saved tensors and offloaded
        none. The module called
        is not the one given, or it was compiled whole. (A skipped batch, a
        forward with nothing in it, reaches nothing once; a training loop's
        other forwards do. Without units, the engine records each
        workload's first forward on device and plans after its backward: a
        forward that ends with no plan in force is not counted, so a GAN's
        second model, recorded in turn, is not taken for a compiled one.)"""
        if self._reached:
            return
        if self._layers is not None:
            what = (f"none of the {len(self._units)} units "
                    f"({type(self._units[0]).__name__}) began inside the context's "
                    "forwards, so nothing was offloaded, recomputed or measured; call "
                    "the model given to OffloadActivations")
            self._unreached += 1
            if self._unreached < 2:
                return
        elif (self._pushes_before is not None
              and _common.pushes(self.offloader) > self._pushes_before):
            if _common.offloaded(self.offloader) > 0:
                self._reached = True
                return
            if not self.offloader.budget_plan_text():
                return  # recorded on device: a workload's first forward
            what = "the context's forwards offloaded nothing they saved for backward"
        else:
            return
        self._reached = True
        warnings.warn(f"actoffload: {what}. {_common.UNREACHED}", stacklevel=3)

    def takes_saved_tensors(self, index):
        """Whether unit `index`'s saved tensors go to the engine now, in its
        forward: its own hooks are in force (_common.UnitHooks), or the
        hooks of the whole forward are."""
        if self._unit_hooks is not None:
            return self._unit_hooks.in_force(index)
        return self._hooks is not None

    def model_modules(self):
        """The modules given (the model, or the layers), whose parameters
        and buffers are never offloaded (SPEC §7.5)."""
        return list(self._modules)

    def budget_plan(self):
        """The budget's plan as a table (empty before it is made): the
        joint plan of the units with a memory probe, else the engine's byte
        budget."""
        if self._joint is not None:
            return self._joint.describe()
        return self.offloader.budget_plan_text()

    @property
    def joint_budget(self):
        """The joint plan's state (budget.JointBudget), or None."""
        return self._joint


def _register_pre_hook(unit, hook):
    """A forward pre-hook that sees the keyword arguments too, where the
    torch version passes them (torch >= 2)."""
    if _KWARGS_HOOKS:
        return unit.register_forward_pre_hook(hook, with_kwargs=True)
    return unit.register_forward_pre_hook(hook)


def _module_tensors(modules):
    """Every parameter and buffer of `modules` and their submodules: each
    module's own dictionaries, read once per module (Module.parameters()
    cost GPT-2's forward 1.5 ms of host time per step on an H100)."""
    tensors, seen, stack = [], set(), list(modules)
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        tensors.extend(t for t in module._parameters.values() if t is not None)
        tensors.extend(t for t in module._buffers.values() if t is not None)
        stack.extend(m for m in module._modules.values() if m is not None)
    return tensors
