"""Which ops' outputs a selective unit saves (recompute._saves; SPEC §4.8):
the costly ones, but a matmul whose output is more than four times its
operands together, eager attention's scores, runs again. The policy is a
pure function of the op and its arguments' shapes, checked here on any
torch; test_selective.py runs it under PyTorch's selective checkpoint."""

import pytest
import torch

from actoffload import recompute

aten = torch.ops.aten


def _t(*shape):
    return torch.empty(shape)


def test_attention_scores_run_again():
    # 8 heads x 1024 tokens, head dimension 64: 8M elements from 1M.
    assert not recompute._saves(aten.bmm.default, (_t(8, 1024, 64), _t(8, 64, 1024)))
    assert not recompute._saves(aten.baddbmm.default,
                                (_t(8, 1024, 1024), _t(8, 1024, 64), _t(8, 64, 1024)))


def test_linear_layers_and_attention_outputs_are_saved():
    # A linear layer's output is smaller than its input and weight: even an
    # MLP's up-projection (2048 -> 5632 over 4096 tokens).
    assert recompute._saves(aten.mm.default, (_t(4096, 2048), _t(2048, 5632)))
    assert recompute._saves(aten.addmm.default, (_t(5632), _t(4096, 2048), _t(2048, 5632)))
    # The scores times the values: 0.5M elements from 8.5M.
    assert recompute._saves(aten.bmm.default, (_t(8, 1024, 1024), _t(8, 1024, 64)))
    # Short sequences: scores no larger than four times query and key.
    assert recompute._saves(aten.bmm.default, (_t(8, 128, 64), _t(8, 64, 128)))
    # Attention kernels and other costly ops whatever their shapes.
    for name in ("_scaled_dot_product_efficient_attention", "convolution"):
        if hasattr(aten, name):
            assert recompute._saves(getattr(aten, name).default, (_t(1, 1, 1024, 64),))


def test_cheap_ops_run_again():
    for op in (aten.relu.default, aten._softmax.default, aten.mul.Tensor):
        assert not recompute._saves(op, (_t(4096, 2048),))


def test_a_matmul_over_an_empty_contraction():
    # No division by its width: (4, 0) @ (0, 4) makes 16 elements from none.
    assert not recompute._saves(aten.mm.default, (_t(4, 0), _t(0, 4)))


def test_an_op_that_draws_random_numbers_runs_again():
    # The re-run restores the forward's RNG state and must draw what it drew.
    assert recompute._draws_random(aten.native_dropout.default, (_t(4, 4), 0.5, True), {})
    assert not recompute._draws_random(aten.mm.default, (_t(4, 4), _t(4, 4)), {})


def test_an_attention_kernel_is_saved_only_without_dropout():
    name = next((n for n in ("_scaled_dot_product_efficient_attention",
                             "_scaled_dot_product_flash_attention_for_cpu")
                 if hasattr(aten, n)), None)
    if name is None:
        pytest.skip("this torch has no SDPA kernels")
    op, q = getattr(aten, name).default, _t(1, 1, 1024, 64)
    assert recompute._saves(op, (q, q, q))
    assert recompute._saves(op, (q, q, q), {"dropout_p": 0.0})
    assert not recompute._saves(op, (q, q, q), {"dropout_p": 0.1})
