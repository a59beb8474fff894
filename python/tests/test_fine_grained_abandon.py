"""SPEC §7.2 for the fine-grained door (fine_grained.py,
PipelineOffloader::AbandonIteration): an exception that leaves a chunk's
forward, or one elsewhere in a step followed by abandon_iteration(), drops
the iteration; the next steps run bit-identically, in the warm-up iteration
too, and nothing stays stuck. On the simulated GPU."""

import pytest
import torch

import actoffload
from models import Stack, assert_identical, train_step
from test_whole_model import MIN, fine_grained_forward


class Boom(Exception):
    pass


def raising_forward(fg, after_layers):
    """fine_grained_forward's chunk, raising after `after_layers` layers
    (inside an open group when after_layers is fractional: x.5; before the
    head when it is the number of layers)."""
    def forward(model, x):
        with fg.chunk(0, 0):
            h = model.embed(x)
            for i, layer in enumerate(model.layers):
                if i == int(after_layers):
                    if after_layers != int(after_layers):
                        h = fg.group_start(h, "attn")
                        layer.qkv(layer.norm1(h))
                    raise Boom()
                h = fg.group_start(h, "attn")
                d = h.shape[-1]
                h = fg.group_commit(
                    h + layer.proj(torch.tanh(layer.qkv(layer.norm1(h))[..., :d])), "attn")
                h = fg.group_start(h, "mlp")
                h = h + layer.down(torch.nn.functional.gelu(layer.up(layer.norm2(h))))
                h = fg.group_commit(h, "mlp")
            raise Boom()  # after every layer, before the head
    return forward


def reference_of(model, x):
    fg = actoffload.FineGrainedOffloader([], min_offload_size=MIN, backend="sim")
    reference = train_step(model, x, fine_grained_forward(fg))
    fg.finish_iteration()
    return reference


def steps(fg, model, x, reference, n):
    for _ in range(n):
        assert_identical(reference, train_step(model, x, fine_grained_forward(fg)))
        fg.finish_iteration()


@pytest.mark.parametrize("warmed_up", [False, True])
@pytest.mark.parametrize("after_layers", [0, 1, 1.5, 3])
def test_an_exception_in_a_chunk_abandons_the_iteration(warmed_up, after_layers):
    model = Stack(layers=3)
    x = torch.randn(2, 64, 64)
    reference = reference_of(model, x)
    fg = actoffload.FineGrainedOffloader(["mlp", "attn"], min_offload_size=MIN,
                                         backend="sim")
    if warmed_up:
        steps(fg, model, x, reference, 1)
    with pytest.warns(UserWarning, match="AbandonIteration"):
        with pytest.raises(Boom):
            train_step(model, x, raising_forward(fg, after_layers))
    assert fg.warmed_up == warmed_up  # an abandoned warm-up runs again
    assert not fg.in_chunk
    steps(fg, model, x, reference, 3)
    assert fg.warmed_up and "mlp" in fg.summary_table()
    assert fg.core.stats()["bytes_offloaded"] > 0
    assert fg.session.hazards() == []


def test_after_an_exception_between_chunks_abandon_iteration_lets_the_step_run_again():
    model = Stack(layers=2)
    x = torch.randn(2, 64, 64)
    reference = reference_of(model, x)
    fg = actoffload.FineGrainedOffloader(["mlp"], min_offload_size=MIN, backend="sim")
    steps(fg, model, x, reference, 1)
    # The chunk ran, its loss raised before the backward: the engine is mid-
    # iteration, and the same chunk is refused until the iteration is dropped.
    out = fine_grained_forward(fg)(model, x)
    del out
    with pytest.raises(actoffload.OffloadError, match="already ran"):
        train_step(model, x, fine_grained_forward(fg))
    with pytest.warns(UserWarning, match="AbandonIteration"):
        fg.abandon_iteration()
    steps(fg, model, x, reference, 2)
    fg.abandon_iteration()  # between iterations: nothing to drop, no warning
    steps(fg, model, x, reference, 1)
    assert fg.session.hazards() == []


def test_the_graph_of_an_abandoned_iteration_is_refused_in_backward():
    model = Stack(layers=2)
    x = torch.randn(2, 64, 64)
    reference = reference_of(model, x)
    fg = actoffload.FineGrainedOffloader(["mlp"], min_offload_size=MIN, backend="sim")
    steps(fg, model, x, reference, 1)
    stale = fine_grained_forward(fg)(model, x)
    with pytest.warns(UserWarning, match="AbandonIteration"):
        fg.abandon_iteration()
    with pytest.raises(actoffload.OffloadError):
        (stale.float() ** 2).mean().backward()
    del stale
    steps(fg, model, x, reference, 2)


def test_where_the_iteration_cannot_be_dropped_the_callers_exception_still_goes_on():
    model = Stack(layers=2)
    x = torch.randn(2, 64, 64)
    fg = actoffload.FineGrainedOffloader(["mlp"], min_offload_size=MIN, backend="sim")

    def refuse():
        raise actoffload.OffloadError("FAILED_PRECONDITION: not during a graph capture")
    fg.abandon_iteration = refuse
    with pytest.warns(UserWarning, match="not dropped: .*graph capture"):
        with pytest.raises(Boom):
            train_step(model, x, raising_forward(fg, 1))
