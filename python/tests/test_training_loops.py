"""Issue 29: training loops as people write them (SPEC §7), over both front
doors on the simulated GPU.

Every case runs the same loop twice per iteration, once without the package
("plain") and once through a front door, on fresh inputs each iteration, and
compares the loss and every parameter gradient bit-identically
(torch.equal). After each iteration, once the graphs are gone, no iteration
may be live and the session must report no hazard; each case asserts that
bytes were really offloaded.

Front doors:
  te         get_cpu_offload_context(True, num_layers=2, model_layers=n,
             min_offload_size=MIN elements), each layer in the context and
             its output through the sync function (models.te_forward's way);
  oa_layers  OffloadActivations(layers=model.layers, min_offload_size=bytes);
  oa_model   OffloadActivations(layers=model, ...) (its longest ModuleList);
  oa_noarg   OffloadActivations() (torchtune's usage: the whole forward under
             the smallest byte budget; the first iteration is recorded).
"""

import contextlib
import gc
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import actoffload
from actoffload.whole_model import NoOpManager, get_act_offloading_ctx_manager
from models import Block, Stack

MIN = 1024          # TE: elements
MIN_BYTES = 4096    # OffloadActivations: bytes
SHAPE = (2, 32, 64)  # batch, sequence, hidden (64): small, still over MIN

ALL_DOORS = ["te", "oa_layers", "oa_model", "oa_noarg"]
LAYER_DOORS = ["te", "oa_layers", "oa_model"]


# --- front doors ---------------------------------------------------------------

class Door:
    """One way of running a model's layers: "plain" (no package) or a
    front door of the package."""

    def __init__(self, kind, model=None, k=2, n=None, min_size=None, **extra):
        self.kind = kind
        self.ctx = self.sync = self.offloader = self.session = None
        if kind == "plain":
            return
        if n is None:
            n = len(model.layers)
        if kind == "te":
            self.ctx, self.sync = actoffload.get_cpu_offload_context(
                True, num_layers=k, model_layers=n,
                min_offload_size=MIN if min_size is None else min_size,
                backend="sim", **extra)
            self.offloader, self.session = self.ctx.offloader, self.ctx._session
            return
        if kind == "oa_noarg":
            if min_size is not None:
                extra["min_offload_size"] = min_size * 4
            self.ctx = actoffload.OffloadActivations(backend="sim", **extra)
        else:
            layers = model.layers if kind == "oa_layers" else model
            self.ctx = actoffload.OffloadActivations(
                layers=layers,
                min_offload_size=MIN_BYTES if min_size is None else min_size * 4,
                backend="sim", **extra)
        self.offloader, self.session = self.ctx.offloader, self.ctx.session

    @property
    def offloads(self):
        return self.kind != "plain"

    def outer(self):
        """What wraps a whole forward."""
        if self.kind.startswith("oa"):
            return self.ctx
        return contextlib.nullcontext()

    def layer(self, layer, h):
        """One layer's forward; what the layer returned, the very object."""
        if self.kind == "te":
            with self.ctx:
                out = layer(h)
            synced = self.sync(out)
            assert synced is out
            return synced
        return layer(h)

    def forward(self, model, x, between=None, order=None, pick=None):
        """model.embed, the layers (in `order`), model.head; `pick` takes
        the hidden state out of what a layer returns; `between(i, h)` runs
        after the i-th layer call."""
        layers = list(model.layers) if order is None else [model.layers[i] for i in order]
        with self.outer():
            h = model.embed(x)
            for i, layer in enumerate(layers):
                h = self.layer(layer, h)
                if pick is not None:
                    h = pick(h)
                if between is not None:
                    h = between(i, h)
            return model.head(h)

    def bytes_offloaded(self):
        return self.offloader.stats()["bytes_offloaded"]

    def assert_clean(self):
        """Once the graphs are gone: nothing live, no hazard."""
        gc.collect()
        assert self.offloader.live_iterations() == 0
        assert self.session.hazards() == []


def zero_grads(model):
    for p in model.parameters():
        p.grad = None


def grads(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def loss_of(out):
    return (out.float() ** 2).mean()


def assert_same(reference, got, it):
    assert len(reference) == len(got)
    for i, (a, b) in enumerate(zip(reference, got)):
        if a is None or b is None:
            assert a is None and b is None, f"iteration {it}: value {i}: {a} vs {b}"
        else:
            assert torch.equal(a, b), f"iteration {it}: value {i} differs"


def abandonment(messages):
    return [m for m in messages if re.search(r"abandon|dropped|freed", m, re.I)]


def run_compare(door, model, step, iters=3, shape=SHAPE, clean=True,
                allow_abandon=False, collect=False):
    """Runs `step(door, model, x, it)` (returning the values to compare)
    plain and through `door`, `iters` times on fresh inputs; returns the
    warnings the door's runs emitted."""
    plain = Door("plain")
    gen = torch.Generator().manual_seed(1234)
    messages, live = [], []
    for it in range(iters):
        x = torch.randn(*shape, generator=gen)
        reference = step(plain, model, x.clone(), it)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = step(door, model, x.clone(), it)
            if collect:
                gc.collect()  # what an exception's traceback may hold
        messages += [str(w.message) for w in caught]
        assert_same(reference, got, it)
        if clean:
            live.append(door.offloader.live_iterations())
            assert door.session.hazards() == []
    assert door.bytes_offloaded() > 0, "nothing was offloaded: the case proves nothing"
    if not allow_abandon:
        assert abandonment(messages) == [], messages
    # Checked last, so that a case failing only here still proved the rest.
    assert live == [0] * len(live), f"live iterations after each iteration: {live}"
    return messages


def normal_step(door, model, x, it=0, **forward_kw):
    zero_grads(model)
    loss = loss_of(door.forward(model, x, **forward_kw))
    loss.backward()
    return [loss.detach()] + grads(model)


# --- known package bugs (issue 29's findings) -------------------------------

# Fixed package bugs this file found (each case here failed before its fix):
# - a kept tensor stored as its own Python object made a saved output's node
#   hold itself through C++, so graphs dropped without a full backward were
#   never freed (now a detached alias);
# - after a detach mid-forward, OffloadActivations(layers) left an empty
#   iteration live until the next forward (EndForward now drops it);
# - a budget refused in OffloadActivations.__enter__ left the context
#   entered for good;
# - TE's context offloaded registered buffers (the modules that run inside
#   it are now noted).


# --- layers for the cases ------------------------------------------------------

class TupleBlock(Block):
    """A Hugging Face-style layer: returns (hidden, None)."""

    def forward(self, x):
        return super().forward(x), None


class DictBlock(Block):
    def forward(self, x):
        return {"hidden": super().forward(x), "aux": None}


class InplaceStartBlock(Block):
    """Begins with an in-place op on its input (the previous layer's output)."""

    def forward(self, x):
        x = x.relu_()
        return super().forward(x)


class FFTBlock(Block):
    """Saves complex128 tensors (16-byte elements: the engine cannot copy
    them) and nothing else beyond a Block (a 0-dim double)."""

    def forward(self, x):
        x = super().forward(x)
        z = torch.view_as_complex(
            x.double().unsqueeze(-1).expand(*x.shape, 2).contiguous())
        f = torch.fft.fft(z, dim=-1)  # saves nothing
        spectrum = (f * f).real + f.abs()  # saves f (complex128) three times
        return x + 1e-4 * spectrum.float()


class EmptyBlock(Block):
    """Saves empty tensors (views and results of ops on x[..., :0])."""

    def forward(self, x):
        x = super().forward(x)
        e = x[..., :0]
        s = (e * e.exp()).sum() + torch.cat([e, e], -1).tanh().sum()
        return x + s


def with_layers(block_cls, layers=4):
    model = Stack(layers=layers)
    model.layers = torch.nn.ModuleList(block_cls() for _ in range(layers))
    return model


# --- 1. graphs traversed more than once (SPEC §7.3) ----------------------------

def traversed_twice(kind, body):
    """A step doing `body` every iteration, except that OffloadActivations()
    first records a plain iteration (a recording traversed twice gives no
    plan: nothing would ever be offloaded), then traverses under its plan."""
    def step(door, model, x, it):
        if kind == "oa_noarg" and it == 0:
            return normal_step(door, model, x)
        return body(door, model, x)
    return step


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_retain_graph_then_second_backward(kind):
    model = Stack(layers=4)

    def body(door, model, x):
        zero_grads(model)
        loss = loss_of(door.forward(model, x))
        loss.backward(retain_graph=True)
        first = grads(model)
        loss.backward()
        return [loss.detach()] + first + grads(model)

    run_compare(Door(kind, model), model, traversed_twice(kind, body), iters=4)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_input_gradient_penalty(kind):
    model = Stack(layers=4)

    def body(door, model, x):
        zero_grads(model)
        x.requires_grad_(True)
        loss = loss_of(door.forward(model, x))
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        penalty = gx.pow(2).sum()
        (loss + penalty).backward()
        return [loss.detach(), penalty.detach(), x.grad.clone()] + grads(model)

    run_compare(Door(kind, model), model, traversed_twice(kind, body), iters=4)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_parameter_gradient_norm_penalty(kind):
    model = Stack(layers=4)

    def body(door, model, x):
        zero_grads(model)
        loss = loss_of(door.forward(model, x))
        gs = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        penalty = sum(g.pow(2).sum() for g in gs)
        (loss + penalty).backward()
        return [loss.detach(), penalty.detach()] + grads(model)

    run_compare(Door(kind, model), model, traversed_twice(kind, body), iters=4)


# --- 2. a backward that never reaches layer 0 (SPEC §7.1) ----------------------

@pytest.mark.parametrize("kind", ALL_DOORS)
def test_frozen_first_layers_then_a_normal_iteration(kind):
    model = Stack(layers=4)
    frozen = list(model.embed.parameters()) + list(model.layers[0].parameters())

    def step(door, model, x, it):
        for p in frozen:
            p.requires_grad_(it >= 3)  # iteration 3: everything trains
        return normal_step(door, model, x)

    run_compare(Door(kind, model), model, step, iters=4)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_detach_between_layers_then_a_normal_iteration(kind, request):
    model = Stack(layers=4)

    def step(door, model, x, it):
        detach_after = 1 if it < 3 else None
        return normal_step(door, model, x, between=lambda i, h: h.detach() if i == detach_after else h)

    # Layers 0-1 have no backward to come once detached: dropping them may be
    # warned.
    run_compare(Door(kind, model), model, step, iters=4, allow_abandon=True)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_backward_inputs_last_layers_then_a_normal_iteration(kind, request):
    # TE keeps layers 2-3 (k=2): layer 2's kept softmax output is never reached.
    model = Stack(layers=4)
    last = list(model.layers[-1].parameters()) + list(model.head.parameters())

    # OffloadActivations() plans its budget from a recorded iteration whose
    # backward popped every saved tensor: its partial passes come after one.
    partial = (1, 2) if kind == "oa_noarg" else (0, 1, 2)

    def step(door, model, x, it):
        if it not in partial:
            return normal_step(door, model, x)
        zero_grads(model)
        loss = loss_of(door.forward(model, x))
        loss.backward(inputs=last)
        return [loss.detach()] + grads(model)

    run_compare(Door(kind, model), model, step, iters=4)


# --- 3. interrupted iterations (SPEC §7.2) -------------------------------------

class Boom(Exception):
    pass


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_forward_thrown_away_then_a_normal_step(kind, request):
    model = Stack(layers=4)

    def step(door, model, x, it):
        out = door.forward(model, x * 0.5)
        del out  # a skipped batch
        return normal_step(door, model, x)

    door = Door(kind, model)
    messages = run_compare(door, model, step, allow_abandon=True)
    assert abandonment(messages), messages


def _raise_in_layer(armed):
    def hook(module, args, output):
        if armed[0]:
            armed[0] = False
            raise Boom("inside layer 2")
    return hook


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_exception_inside_a_layer_then_retry(kind):
    model = Stack(layers=4)
    armed = [False]
    model.layers[2].register_forward_hook(_raise_in_layer(armed))

    def step(door, model, x, it):
        armed[0] = True
        zero_grads(model)
        with pytest.raises(Boom):
            door.forward(model, x)
        assert not armed[0]
        return normal_step(door, model, x)

    door = Door(kind, model)
    messages = run_compare(door, model, step, allow_abandon=True, collect=True)
    assert abandonment(messages), messages


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_exception_between_layers_then_retry(kind):
    model = Stack(layers=4)

    def step(door, model, x, it):
        def between(i, h):
            if i == 1:
                raise Boom("between layers 1 and 2")
            return h
        zero_grads(model)
        with pytest.raises(Boom):
            door.forward(model, x, between=between)
        return normal_step(door, model, x)

    door = Door(kind, model)
    messages = run_compare(door, model, step, allow_abandon=True, collect=True)
    assert abandonment(messages), messages


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_exception_in_backward_then_a_normal_step(kind):
    # A gradient hook on layer 1's output raises (a NaN check): the pass
    # stops without its end callback; the next step runs normally.
    model = Stack(layers=4)

    def step(door, model, x, it):
        def between(i, h):
            if i == 1:
                def check(grad):
                    raise Boom("a NaN check in backward")
                h.register_hook(check)
            return h
        zero_grads(model)
        loss = loss_of(door.forward(model, x, between=between))
        with pytest.raises(Boom):
            loss.backward()
        del loss
        return normal_step(door, model, x)

    run_compare(Door(kind, model), model, step, allow_abandon=True, collect=True)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_eval_pass_with_grad_enabled_between_steps(kind, request):
    model = Stack(layers=4)

    def step(door, model, x, it):
        first = normal_step(door, model, x)
        model.eval()
        evaluated = loss_of(door.forward(model, x * 2)).detach()  # grad on, no backward
        model.train()
        return first + [evaluated] + normal_step(door, model, x * 3)

    door = Door(kind, model)
    messages = run_compare(door, model, step, allow_abandon=True)
    assert abandonment(messages), messages  # the evaluation's graph was dropped


# --- 4. in place on a layer's output (SPEC §7.6) -------------------------------

@pytest.mark.parametrize("kind", ALL_DOORS)
def test_in_place_on_the_synced_output(kind):
    model = Stack(layers=4)
    returned = {}
    for layer in model.layers:
        layer.register_forward_hook(lambda m, a, out: returned.__setitem__(id(m), out))

    def step(door, model, x, it):
        def between(i, h):
            assert h is returned[id(model.layers[i])]  # the very object
            h.relu_()
            return h
        return normal_step(door, model, x, between=between)

    run_compare(Door(kind, model), model, step)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_next_block_starts_with_an_in_place_op(kind):
    model = with_layers(InplaceStartBlock)
    run_compare(Door(kind, model), model, normal_step)


# --- 5. several forwards before one backward (SPEC §7.4) -----------------------

@pytest.mark.parametrize("kind", ALL_DOORS)
def test_two_forwards_one_backward(kind):
    model = Stack(layers=4)

    def step(door, model, x, it):
        zero_grads(model)
        out1 = door.forward(model, x)
        out2 = door.forward(model, x.flip(1) * 0.5)
        loss = -F.cosine_similarity(out1, out2, dim=-1).mean() + (out1 - out2).pow(2).mean()
        loss.backward()
        return [loss.detach()] + grads(model)

    run_compare(Door(kind, model), model, step)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_shared_block_applied_twice(kind):
    model = Stack(layers=4)
    order = [0, 1, 1, 2, 3]  # layer 1 shared: applied twice

    def step(door, model, x, it):
        return normal_step(door, model, x, order=order)

    # TE counts layer calls: a loop of five calls says model_layers=5.
    door = Door(kind, model, n=5) if kind == "te" else Door(kind, model)
    run_compare(door, model, step)


# --- 6. tensors the engine cannot or need not move (SPEC §7.5) -----------------

@pytest.mark.parametrize("kind", ALL_DOORS)
def test_complex128_activations_stay_on_device(kind):
    fft_model = with_layers(FFTBlock)
    plain_model = Stack(layers=4)
    plain_model.load_state_dict(fft_model.state_dict())
    fft_door = Door(kind, fft_model)
    run_compare(fft_door, fft_model, normal_step)
    plain_door = Door(kind, plain_model)
    run_compare(plain_door, plain_model, normal_step)
    # The complex tensors (2 x 2*64*64*16 B per layer) were never moved:
    # the same bytes as the model without them.
    assert fft_door.bytes_offloaded() == plain_door.bytes_offloaded()


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_min_size_zero_with_empty_saved_tensors(kind):
    model = with_layers(EmptyBlock)
    run_compare(Door(kind, model, min_size=0), model, normal_step)


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
