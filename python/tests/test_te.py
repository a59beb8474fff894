"""TE's front door on the simulated GPU: a training loop written for
get_cpu_offload_context runs unchanged and gives bit-identical results;
views, duplicates and misuse behave as SPEC §2-§4 say."""

import pytest
import torch

import actoffload
from models import Stack, assert_identical, te_forward, te_manual_forward, train_step

MIN = 1024  # elements: the test tensors are small


@pytest.mark.parametrize("k", [1, 2, 3])
def test_bit_identical_to_no_offload_at_every_k(k):
    model = Stack(layers=4)
    x = torch.randn(2, 64, 64)
    reference = train_step(model, x)
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=k, model_layers=4, min_offload_size=MIN, backend="sim")
    for _ in range(3):
        assert_identical(reference, train_step(model, x, te_forward(ctx, sync)))
    stats = ctx.offloader.stats()
    assert stats["tensors_offloaded"] > 0
    assert stats["bytes_reloaded"] == stats["bytes_offloaded"]
    assert [ctx.offloader.will_offload(i) for i in range(4)] == [i < k for i in range(4)]
    assert ctx._session.hazards() == []


def test_disabled_is_a_pass_through():
    ctx, sync = actoffload.get_cpu_offload_context(False, num_layers=1, model_layers=4)
    model = Stack(layers=4)
    x = torch.randn(2, 16, 64)
    assert_identical(train_step(model, x), train_step(model, x, te_forward(ctx, sync)))


class SaveViews(torch.autograd.Function):
    """Saves views of one storage (split halves, a transpose, the same
    tensor twice) and checks in backward that they come back as views with
    the same sizes and strides over one storage, with the same values."""

    seen = {}

    @staticmethod
    def forward(ctx, x):
        y = x * 2
        views = (y[:, :64], y[:, 64:], y.t(), y, y)
        ctx.save_for_backward(*views)
        SaveViews.seen["expected"] = [v.detach().clone() for v in views]
        SaveViews.seen["geometry"] = [(v.shape, v.stride()) for v in views]
        return y.sum(1)

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        SaveViews.seen["geometry_back"] = [(v.shape, v.stride()) for v in saved]
        SaveViews.seen["storages"] = {v.storage().data_ptr() for v in saved}
        SaveViews.seen["equal"] = all(
            torch.equal(a, b) for a, b in zip(saved, SaveViews.seen["expected"]))
        return grad[:, None].expand(-1, 128) * 2


def test_views_come_back_as_views_of_one_storage_and_duplicates_move_once():
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    x = torch.randn(256, 128, requires_grad=True)
    with ctx:
        h = SaveViews.apply(x)
    h = sync(h)
    with ctx:
        out = h * 3
    out = sync(out)
    out.sum().backward()
    seen = SaveViews.seen
    assert seen["geometry_back"] == seen["geometry"]
    assert len(seen["storages"]) == 1
    assert seen["equal"]
    stats = ctx.offloader.stats()
    # One span for the five views: 256 x 128 floats copied once (SPEC §2.4).
    assert stats["spans_offloaded"] == 1
    assert stats["bytes_offloaded"] == 256 * 128 * 4
    assert ctx._session.hazards() == []


def test_a_saved_tensor_modified_in_place_is_autogrades_error():
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    x = torch.randn(128, 128, requires_grad=True)
    with ctx:
        a = x * 1
        b = a.exp()  # saves its output
    b = sync(b)
    with ctx:
        c = b * 2
    c = sync(c)
    with torch.no_grad():
        b.add_(1)  # in place on a tensor saved for backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def test_reentering_the_context_is_an_error():
    # TE's RuntimeError, at the nested enter.
    ctx, _ = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, backend="sim")
    with ctx:
        with pytest.raises(RuntimeError, match="entered again"):
            with ctx:
                pass


def test_more_layers_than_model_layers_begin_the_next_forward():
    # As TE counts layers modulo model_layers: a fifth layer is the next
    # forward's first, and both backwards come out right.
    model = Stack(layers=4)
    x = torch.randn(2, 64, 64)
    reference = train_step(model, x)
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    assert_identical(reference, train_step(model, x, te_forward(ctx, sync)))
    assert ctx.offloader.stats()["bytes_offloaded"] > 0
    assert ctx.offloader.live_iterations() == 0


def test_num_layers_equal_to_model_layers_is_refused():
    with pytest.raises(ValueError, match="Cannot offload all layers"):
        actoffload.get_cpu_offload_context(True, num_layers=4, model_layers=4, backend="sim")


def test_backward_twice_without_retain_graph_is_autogrades_error():
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    x = torch.randn(128, 128, requires_grad=True)
    for _ in range(2):
        with ctx:
            x = torch.tanh(x)
        x = sync(x)
    loss = x.sum()
    loss.backward()
    # The sync function's backward runs first: the engine refuses a
    # BackwardStep for an iteration whose backward already finished.
    with pytest.raises(RuntimeError, match="forward has not run|second time"):
        loss.backward()


def test_manual_synchronization_offers_tes_calls():
    ctx, sync, synchronizer = actoffload.get_cpu_offload_context(
        True, model_layers=3, manual_synchronization=True, min_offload_size=MIN,
        backend="sim")
    model = Stack(layers=3)
    x = torch.randn(2, 64, 64)
    reference = train_step(model, x)

    # The release through the sync function: it offers TE's calls too.
    forward = te_manual_forward(ctx, sync, synchronizer, sync)
    assert_identical(reference, train_step(model, x, forward))
    assert ctx.offloader.stats()["bytes_reloaded"] > 0
    assert ctx._session.hazards() == []


def test_manual_calls_need_manual_mode():
    _, sync = actoffload.get_cpu_offload_context(True, num_layers=1, model_layers=2, backend="sim")
    with pytest.raises(RuntimeError, match="manual_synchronization"):
        sync.start_offload_layer(0)


def test_memory_returns_to_baseline_when_dropped():
    session = actoffload.new_session("sim")
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=2, model_layers=4, min_offload_size=MIN, session=session)
    model = Stack(layers=4)
    x = torch.randn(2, 64, 64)
    train_step(model, x, te_forward(ctx, sync))
    assert ctx.offloader.stats()["bytes_offloaded"] > 0
    del ctx, sync
    import gc
    gc.collect()
    session.synchronize()
    assert session.sim_device_live_bytes() == 0


def test_mark_not_offload_keeps_a_tensor_on_device():
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, min_offload_size=MIN, backend="sim")
    x = torch.randn(128, 128, requires_grad=True)
    with ctx:
        y = x * 2
        actoffload.mark_not_offload(y)
        z = y.exp() * y  # saves y (marked) and exp(y)
    z = sync(z)
    with ctx:
        w = z * 1
    w = sync(w)
    w.sum().backward()
    # exp(y) offloaded; y kept (it never reached the engine).
    assert ctx.offloader.stats()["bytes_offloaded"] == 128 * 128 * 4
