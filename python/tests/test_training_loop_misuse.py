"""Issue 29's misuse and parity cases (SPEC §7.5-§7.8; docs/python.md's
parity table): misuse at its own call with upstream's exception class,
parameters and buffers never offloaded, torchtune's and TE's signatures and
meanings. The doors and layers are loop_doors.py's."""

from loop_doors import *  # noqa: F401,F403
from loop_doors import contextlib, gc, re, warnings, pytest, torch, F, actoffload  # noqa: F401
from loop_doors import NoOpManager, get_act_offloading_ctx_manager, Block, Stack  # noqa: F401


# --- 7. misuse (SPEC §7.6-§7.8) -------------------------------------------------

@pytest.mark.parametrize("kind", ALL_DOORS)
def test_tuple_output_first_tensor_is_marked(kind):
    model = with_layers(TupleBlock)

    def step(door, model, x, it):
        def pick(out):
            assert isinstance(out, tuple) and out[1] is None
            return out[0]

        def between(i, h):
            if i == 0 and door.kind in LAYER_DOORS and torch.is_grad_enabled():
                assert h._backward_hooks, "the layer's first tensor was not marked"
            return h
        return normal_step(door, model, x, pick=pick, between=between)

    run_compare(Door(kind, model), model, step)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_dict_output(kind):
    model = with_layers(DictBlock)
    run_compare(Door(kind, model), model,
                lambda d, m, x, it: normal_step(d, m, x, pick=lambda out: out["hidden"]))


def test_te_sync_result_ignored():
    model = Stack(layers=4)
    door = Door("te", model)

    def step(d, model, x, it):
        zero_grads(model)
        h = model.embed(x)
        for layer in model.layers:
            if d.offloads:
                with d.ctx:
                    h = layer(h)
                d.sync(h)  # result ignored; h used on
            else:
                h = layer(h)
        loss = loss_of(model.head(h))
        loss.backward()
        return [loss.detach()] + grads(model)

    run_compare(door, model, step)


def test_te_sync_left_off_the_last_layer():
    model = Stack(layers=4)
    door = Door("te", model)

    def step(d, model, x, it):
        zero_grads(model)
        h = model.embed(x)
        for i, layer in enumerate(model.layers):
            if d.offloads:
                with d.ctx:
                    h = layer(h)
                if i < 3:
                    h = d.sync(h)
            else:
                h = layer(h)
        loss = loss_of(model.head(h))
        loss.backward()
        return [loss.detach()] + grads(model)

    run_compare(door, model, step)


@pytest.mark.parametrize("layers", [False, True], ids=["no_layers", "layers"])
def test_budget_too_small_is_refused_once_then_runs(layers, request):
    model = Stack(layers=4)
    extra = {"layers": model.layers} if layers else {}
    ctx = actoffload.OffloadActivations(budget_bytes=1, min_offload_size=MIN_BYTES,
                                        backend="sim", **extra)
    door = Door("plain")
    door.kind, door.ctx = "oa_budget", ctx
    door.offloader, door.session = ctx.offloader, ctx.session
    plain = Door("plain")
    gen = torch.Generator().manual_seed(5)
    refusals = []
    for it in range(5):
        x = torch.randn(*SHAPE, generator=gen)
        reference = normal_step(plain, model, x)
        try:
            got = normal_step(door, model, x)
        except ValueError as e:
            refusals.append((it, str(e)))
            got = normal_step(door, model, x)  # the retry runs
        assert_same(reference, got, it)
        door.assert_clean()
    assert len(refusals) == 1, refusals
    it, message = refusals[0]
    assert it == 1, "refused at the first forward after the first iteration"
    smallest = [int(n) for n in re.findall(r"smallest[^0-9]*(\d+)", message)]
    assert smallest and smallest[0] > 1, message
    assert door.bytes_offloaded() > 0
    # The budget named fits: no refusal with it.
    fits = actoffload.OffloadActivations(budget_bytes=smallest[0], min_offload_size=MIN_BYTES,
                                         backend="sim", **extra)
    fdoor = Door("plain")
    fdoor.kind, fdoor.ctx = "oa_budget", fits
    fdoor.offloader, fdoor.session = fits.offloader, fits.session
    run_compare(fdoor, model, normal_step)


def test_te_argument_errors():
    with pytest.raises(ValueError):
        actoffload.get_cpu_offload_context(True, num_layers=4, model_layers=4, backend="sim")
    with pytest.raises(ValueError):
        actoffload.get_cpu_offload_context(True, num_layers=7, model_layers=4, backend="sim")
    with pytest.raises(ValueError, match="offload_stream"):
        actoffload.get_cpu_offload_context(True, num_layers=1, model_layers=4,
                                           offload_stream=object(), backend="sim")
    with pytest.raises(ValueError, match="weights/activations"):
        actoffload.get_cpu_offload_context(True, num_layers=1, model_layers=4,
                                           offload_activations=False,
                                           offload_weights=False, backend="sim")
    with pytest.warns(DeprecationWarning):
        actoffload.get_cpu_offload_context(True, num_layers=1, model_layers=4,
                                           offload_weights=True, backend="sim")


def test_te_nested_enter_is_refused_and_the_next_step_runs():
    model = Stack(layers=4)
    door = Door("te", model)

    def step(d, model, x, it):
        if d.offloads and it == 1:
            with pytest.raises(RuntimeError, match="entered again"):
                with d.ctx:
                    h = model.layers[0](model.embed(x))
                    with d.ctx:
                        pass
        return normal_step(d, model, x)

    run_compare(door, model, step, allow_abandon=True, collect=True)


# --- 8. parameters, their views and buffers are never offloaded (SPEC §7.5) ---

class LoRALayer(torch.nn.Module):
    """A frozen base Linear (F.linear saves weight.t(), a view of a frozen
    parameter), trainable low-rank adapters, and a registered buffer used
    multiplicatively (saved because its other operand requires grad)."""

    def __init__(self, hidden=64, rank=4, seq=SHAPE[1], materialize=False):
        super().__init__()
        self.base = torch.nn.Linear(hidden, hidden)
        self.base.requires_grad_(False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, hidden) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(hidden, rank) * 0.1)
        self.register_buffer("scale", torch.rand(seq, hidden) + 0.5)
        self.materialize = materialize  # the control: copies, not the module's

    def forward(self, x):
        weight, scale = self.base.weight, self.scale
        if self.materialize:
            weight, scale = weight * 1.0, scale * 1.0
        h = F.linear(x, weight, self.base.bias) * scale
        h = h + F.linear(F.linear(x, self.lora_a), self.lora_b)
        return torch.tanh(h) + x


class OnlyModelTensorsLayer(LoRALayer):
    """Saves nothing but a frozen weight's view and a buffer."""

    def forward(self, x):
        weight, scale = self.base.weight, self.scale
        if self.materialize:
            weight, scale = weight * 1.0, scale * 1.0
        return F.linear(x, weight) * scale + x


def lora_model(cls=LoRALayer, materialize=False):
    model = Stack(layers=4)
    model.layers = torch.nn.ModuleList(cls(materialize=materialize) for _ in range(4))
    model.embed.requires_grad_(False)
    return model


def input_requiring_grad(step):
    def wrapped(door, model, x, it):
        x.requires_grad_(True)
        return step(door, model, x, it) + [x.grad.clone()]
    return wrapped


def saved_in_offloaded_layers(model, x, k, min_bytes):
    """(bytes of the distinct activation storages saved in the first k
    layers at or above min_bytes, how many parameter/buffer tensors were
    saved there) by a Python probe."""
    model_storages = {t.storage().data_ptr() for t in
                      list(model.parameters()) + list(model.buffers())}
    activations, model_tensors = {}, [0]

    def pack(t):
        ptr = t.storage().data_ptr()
        if ptr in model_storages:
            model_tensors[0] += 1
        elif not (t.is_leaf and t.requires_grad) and t.numel() * t.element_size() >= min_bytes:
            activations[ptr] = t.storage().nbytes()
        return t

    x = x.clone().requires_grad_(True)
    h = model.embed(x)
    for i, layer in enumerate(model.layers):
        if i < k:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                h = layer(h)
        else:
            h = layer(h)
    return sum(activations.values()), model_tensors[0]


@pytest.mark.parametrize("kind", ["oa_layers_model", "oa_model", "te"])
def test_lora_frozen_weights_views_and_buffers_are_not_offloaded(kind, request):
    model = lora_model()
    k = 2 if kind == "te" else 3
    if kind == "te":
        door = Door("te", model, k=k)
    elif kind == "oa_model":
        door = Door("oa_model", model)
    else:
        door = Door("oa_layers", model)
        door.ctx = actoffload.OffloadActivations(layers=model.layers, model=model,
                                                 min_offload_size=MIN_BYTES, backend="sim")
        door.offloader, door.session = door.ctx.offloader, door.ctx.session
    step = input_requiring_grad(normal_step)
    x = torch.randn(*SHAPE)
    expected, model_tensors = saved_in_offloaded_layers(model, x, k, MIN * 4)
    assert model_tensors >= 2 * k  # weight.t() and the buffer, per layer
    before = 0
    plain = Door("plain")
    for it in range(3):
        assert_same(step(plain, model, x.clone(), it), step(door, model, x.clone(), it), it)
        door.assert_clean()
        now = door.bytes_offloaded()
        assert now - before == expected, (now - before, expected)
        before = now
    assert expected > 0


@pytest.mark.parametrize("kind", ["oa_layers", "oa_model", "te"])
def test_only_parameters_and_buffers_saved_nothing_offloaded(kind, request):
    step = input_requiring_grad(normal_step)
    # The control: the same computation on copies of the weight and buffer
    # (activations, offloaded).
    control = lora_model(OnlyModelTensorsLayer, materialize=True)
    run_compare(Door(kind, control), control, step)
    model = lora_model(OnlyModelTensorsLayer)
    model.load_state_dict(control.state_dict())
    door = Door(kind, model)
    plain = Door("plain")
    x = torch.randn(*SHAPE)
    for it in range(3):
        assert_same(step(plain, model, x.clone(), it), step(door, model, x.clone(), it), it)
        door.assert_clean()
    assert door.bytes_offloaded() == 0
    assert door.offloader.stats()["tensors_offloaded"] == 0


def test_te_frozen_weight_views_only_nothing_offloaded():
    """TE knows no module: no buffer here, only a frozen weight's view."""
    class FrozenOnly(OnlyModelTensorsLayer):
        def forward(self, x):
            weight = self.base.weight * 1.0 if self.materialize else self.base.weight
            return F.linear(x, weight) + x

    step = input_requiring_grad(normal_step)
    control = lora_model(FrozenOnly, materialize=True)
    run_compare(Door("te", control, min_size=256), control, step)
    model = lora_model(FrozenOnly)
    door = Door("te", model, min_size=256)
    plain = Door("plain")
    x = torch.randn(*SHAPE)
    for it in range(3):
        assert_same(step(plain, model, x.clone(), it), step(door, model, x.clone(), it), it)
        door.assert_clean()
    assert door.bytes_offloaded() == 0


# --- 9. torchtune and TE parity -------------------------------------------------

def test_torchtune_no_argument():
    model = Stack(layers=4)
    run_compare(Door("oa_noarg", model), model, normal_step)


@pytest.mark.parametrize("args,kwargs", [
    ((True, True, 5, 1024), {}),
    ((), {"use_pin_memory": True, "use_streams": True, "max_fwd_stash_size": 5,
          "min_offload_size": 1024}),
    ((True,), {"use_streams": True, "min_offload_size": 2048}),
], ids=["positional", "keyword", "mixed"])
def test_torchtune_signature(args, kwargs):
    model = Stack(layers=4)
    ctx = actoffload.OffloadActivations(*args, backend="sim", **kwargs)
    door = Door("plain")
    door.kind, door.ctx = "oa_sig", ctx
    door.offloader, door.session = ctx.offloader, ctx.session
    run_compare(door, model, normal_step)


def test_torchtune_max_fwd_stash_size_zero_is_refused():
    with pytest.raises(ValueError, match="max_fwd_stash_size"):
        actoffload.OffloadActivations(max_fwd_stash_size=0, backend="sim")
    with pytest.raises(ValueError, match="max_fwd_stash_size"):
        actoffload.OffloadActivations(True, True, 0, backend="sim")


class Exp(torch.nn.Module):
    def forward(self, x):
        return (x * 2).exp()  # saves its 1000-byte result


@pytest.mark.parametrize("min_size,moved", [(1024, 0), (1001, 0), (1000, 1000), (512, 1000)])
def test_torchtune_min_offload_size_is_bytes(min_size, moved):
    layers = torch.nn.ModuleList([Exp(), Exp()])
    ctx = actoffload.OffloadActivations(layers=layers, min_offload_size=min_size,
                                        backend="sim")
    x = torch.randn(250, requires_grad=True)  # 1000 bytes
    expected = torch.autograd.grad(layers[1](layers[0](x)).sum(), x)[0]
    for _ in range(3):
        with ctx:
            y = layers[1](layers[0](x))
        (got,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(expected, got)
    del y
    gc.collect()
    assert ctx.offloader.stats()["bytes_offloaded"] == 3 * moved
    assert ctx.offloader.live_iterations() == 0
    assert ctx.session.hazards() == []


@pytest.mark.parametrize("min_elements,moved", [(256, 0), (250, 1000)])
def test_te_min_offload_size_is_elements(min_elements, moved):
    layers = [Exp(), Exp()]
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=min_elements, backend="sim")
    x = torch.randn(250, requires_grad=True)
    expected = torch.autograd.grad(layers[1](layers[0](x)).sum(), x)[0]
    for _ in range(3):
        h = x
        for layer in layers:
            with ctx:
                h = layer(h)
            h = sync(h)
        (got,) = torch.autograd.grad(h.sum(), x)
        assert torch.equal(expected, got)
    del h
    gc.collect()
    assert ctx.offloader.stats()["bytes_offloaded"] == 3 * moved
    assert ctx.offloader.live_iterations() == 0


class NoOpInside(torch.nn.Module):
    def __init__(self, noop):
        super().__init__()
        self.noop = noop

    def forward(self, x):
        if self.noop:
            with NoOpManager():
                return x.exp() * 2
        return x.exp() * 2


@pytest.mark.parametrize("noop", [False, True])
def test_torchtune_noop_manager_keeps_tensors_on_device(noop):
    layers = torch.nn.ModuleList([NoOpInside(noop), NoOpInside(False)])
    ctx = actoffload.OffloadActivations(layers=layers, min_offload_size=512, backend="sim")
    x = torch.randn(64, 64, requires_grad=True)
    expected = torch.autograd.grad(layers[1](layers[0](x)).sum(), x)[0]
    for _ in range(3):
        with ctx:
            y = layers[1](layers[0](x))
        (got,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(expected, got)
    del y
    gc.collect()
    assert ctx.offloader.stats()["bytes_offloaded"] == (0 if noop else 3 * 64 * 64 * 4)
    assert ctx.offloader.live_iterations() == 0


class HeadedStack(Stack):
    """torchtune's layout: the output head is model.output."""

    def __init__(self):
        super().__init__(layers=4)
        self.output = self.head


def test_torchtune_get_act_offloading_ctx_manager(monkeypatch):
    monkeypatch.setenv("ACTOFFLOAD_BACKEND", "sim")
    model = HeadedStack()
    assert isinstance(get_act_offloading_ctx_manager(model, False), contextlib.nullcontext)
    ctx = get_act_offloading_ctx_manager(model, True)
    door = Door("plain")
    door.kind, door.ctx = "oa_recipe", ctx
    door.offloader, door.session = ctx.offloader, ctx.session
    run_compare(door, model, normal_step)


def test_te_context_as_a_decorator():
    model = Stack(layers=4)
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=2, model_layers=4, min_offload_size=MIN, backend="sim")
    assert isinstance(ctx, contextlib.ContextDecorator)

    @ctx
    def run_layer(layer, h):
        return layer(h)

    door = Door("plain")
    door.kind, door.ctx, door.sync = "te_decorator", ctx, sync
    door.offloader, door.session = ctx.offloader, ctx._session

    def step(d, model, x, it):
        zero_grads(model)
        h = model.embed(x)
        for layer in model.layers:
            h = sync(run_layer(layer, h)) if d.offloads else layer(h)
        loss = loss_of(model.head(h))
        loss.backward()
        return [loss.detach()] + grads(model)

    run_compare(door, model, step)


class Marking(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, x):
        y = x * 2
        if self.mode == "mark_not_offload":
            actoffload.mark_not_offload(y)
        elif self.mode == "_TE_do_not_offload":
            y._TE_do_not_offload = True
        return y.exp() * y  # saves exp(y) (twice) and y


@pytest.mark.parametrize("door_kind", ["te", "oa_layers"])
@pytest.mark.parametrize("mode", [None, "mark_not_offload", "_TE_do_not_offload"])
def test_marked_tensors_stay_on_device(door_kind, mode):
    layers = torch.nn.ModuleList([Marking(mode), Marking(None)])
    if door_kind == "te":
        ctx, sync = actoffload.get_cpu_offload_context(
            True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    else:
        ctx = actoffload.OffloadActivations(layers=layers, min_offload_size=MIN_BYTES,
                                            backend="sim")

    def forward(x, offload):
        if not offload:
            return layers[1](layers[0](x))
        if door_kind == "te":
            h = x
            for layer in layers:
                with ctx:
                    h = layer(h)
                h = sync(h)
            return h
        with ctx:
            return layers[1](layers[0](x))

    x = torch.randn(64, 64, requires_grad=True)
    for _ in range(3):
        expected = torch.autograd.grad(forward(x * 0.1, False).sum(), x)[0]
        got = torch.autograd.grad(forward(x * 0.1, True).sum(), x)[0]
        assert torch.equal(expected, got)
    gc.collect()
    nbytes = 64 * 64 * 4
    per_iteration = nbytes if mode else 2 * nbytes
    assert ctx.offloader.stats()["bytes_offloaded"] == 3 * per_iteration
    assert ctx.offloader.live_iterations() == 0
