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
  oa_model   OffloadActivations(layers=model, ...) (its layer stack);
  oa_noarg   OffloadActivations() (torchtune's usage: the whole forward under
             the smallest byte budget; the first iteration is recorded);
  oa_budget  OffloadActivations(layers, budget_fraction=0.5) on a scripted
             device, its profile and race run, then a plan that offloads
             layer 0, recomputes layer 1 and keeps the rest
             (loop_doors._settled_budget).
"""

from loop_doors import *  # noqa: F401,F403 (the doors and layers of the cases)
from loop_doors import contextlib, gc, re, warnings, pytest, torch, F, actoffload  # noqa: F401
from loop_doors import NoOpManager, get_act_offloading_ctx_manager, Block, Stack  # noqa: F401
import torch.utils.checkpoint  # noqa: E402
from actoffload import _common


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


class _CheckpointedInside(Block):
    """A layer that runs its block under a non-reentrant checkpoint of its
    own (a model's internal checkpointing), which raises once armed."""
    armed = False

    def forward(self, x):
        def inner(x):
            out = super(_CheckpointedInside, self).forward(x)
            if _CheckpointedInside.armed:
                _CheckpointedInside.armed = False
                raise Boom("inside a checkpoint inside layer 2")
            return out
        return torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_exception_inside_a_checkpoint_inside_a_layer_then_retry(kind):
    # PyTorch's checkpoint (torch >= 2.1) leaves its saved-tensor hooks in
    # force where its function raises, until the traceback goes; the
    # caller here keeps the exception. The door's exit ends that checkpoint
    # (_common.close_abandoned_checkpoints), so its own hooks come off and
    # nothing stays in force; the retry is bit-identical.
    model = Stack(layers=4)
    model.layers[2] = _CheckpointedInside()
    kept = []

    def step(door, model, x, it):
        zero_grads(model)
        _CheckpointedInside.armed = True
        with pytest.raises(Boom) as raised:
            door.forward(model, x)
        if door.offloads:
            kept.append(raised)
            assert _common.saved_hooks_top() in (None, NotImplemented)
        else:  # without the package, the checkpoint ends when collected
            del raised
            gc.collect()
        return normal_step(door, model, x)

    door = Door(kind, model)
    messages = run_compare(door, model, step, allow_abandon=True)
    assert len(kept) == 3 and abandonment(messages), messages
    kept.clear()
    gc.collect()


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
    # stops without its end callback. Once the caller drops its loss, its
    # iteration has ended (what the pass reloaded and the host copies are
    # not held until the next step); the next step runs normally.
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
        if door.offloads:
            assert door.offloader.live_iterations() == 0, it
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


@pytest.mark.parametrize("kind", ["te", "oa_layers", "oa_model", "oa_noarg"])
def test_a_model_too_small_to_offload_runs_without_a_word(kind):
    # SPEC §7.1: an iteration begins at the first tensor handed to the engine.
    # A forward whose every saved tensor is under the size threshold (a smoke
    # test's tiny model) begins none, so its end, after a backward or without
    # one (an evaluation with grad on), releases nothing and says nothing.
    # OffloadActivations() warned "AbandonIteration ... dropped" every step.
    model = Stack(layers=4)
    door, plain = Door(kind, model, min_size=10**9), Door("plain")
    gen = torch.Generator().manual_seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for it in range(4):
            x = torch.randn(*SHAPE, generator=gen)
            if it == 2:  # evaluated with grad on: no backward
                door.forward(model, x)
                continue
            assert_same(normal_step(plain, model, x.clone()),
                        normal_step(door, model, x.clone()), it)
    messages = [str(w.message) for w in caught]
    assert not any("actoffload: AbandonIteration" in m or "dropped" in m
                   for m in messages), messages
    assert door.bytes_offloaded() == 0
    door.assert_clean()
