"""The package on a real GPU (skipped without CUDA): PyTorch's current
stream and caching allocator, bit-identical steps, lower peak memory, and
memory back to baseline. The Hugging Face models are in actoffload.demo."""

import gc

import pytest
import torch

import actoffload
from models import (Stack, assert_identical, recorded_bytes, smallest_budget, te_forward,
                    te_manual_forward, train_step, whole_forward)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU")
MIN = 1024


def peak_of(step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = step()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - base


def test_te_drop_in_is_bit_identical_and_lowers_the_peak():
    model = Stack(layers=6, hidden=512).cuda()
    x = torch.randn(4, 512, 512, device="cuda")
    reference, peak_none = peak_of(lambda: train_step(model, x))
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=4, model_layers=6, min_offload_size=MIN, backend="cuda")
    for _ in range(3):
        got, peak = peak_of(lambda: train_step(model, x, te_forward(ctx, sync)))
        assert_identical(reference, got)
    assert ctx.offloader.stats()["bytes_offloaded"] > 0
    assert peak < 0.8 * peak_none, (peak, peak_none)


def test_byte_budget_on_cuda_is_bit_identical():
    model = Stack(layers=6, hidden=512).cuda()
    x = torch.randn(4, 512, 512, device="cuda")
    reference = train_step(model, x)
    # The engine's byte budget (SPEC §4.7): without layers (a CUDA model's
    # layers would make it the joint budget, test_gpu_budget.py), a third of
    # what a recording saves, as the simulator's test does.
    total = recorded_bytes(model, x, min_offload_size=MIN, backend="cuda")
    make = lambda budget: actoffload.OffloadActivations(  # noqa: E731
        budget_bytes=budget, min_offload_size=MIN, backend="cuda")
    ctx = make(max(total // 3, smallest_budget(make, model, x)))
    for _ in range(3):
        assert_identical(reference, train_step(model, x, whole_forward(ctx)))
    assert ctx.offloader.stats()["bytes_reloaded"] > 0


def test_memory_returns_to_baseline():
    model = Stack(layers=4, hidden=512).cuda()
    x = torch.randn(4, 512, 512, device="cuda")
    train_step(model, x)
    for p in model.parameters():
        p.grad = None
    gc.collect()  # what earlier tests left behind
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=2, model_layers=4, min_offload_size=MIN, backend="cuda")
    train_step(model, x, te_forward(ctx, sync))
    for p in model.parameters():
        p.grad = None
    del ctx, sync
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


def test_another_current_stream_is_refused():
    ctx, sync = actoffload.get_cpu_offload_context(
        True, num_layers=1, model_layers=2, backend="cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(actoffload.OffloadError, match="current CUDA stream"):
            with ctx:
                pass


def test_manual_mode_copies_on_the_given_offload_stream():
    # TE's offload_stream (manual synchronization): both directions copy on
    # it (CudaBackend::WrapStream over its cuda_stream), bit-identically.
    stream = torch.cuda.Stream()
    ctx, sync, synchronizer = actoffload.get_cpu_offload_context(
        True, model_layers=3, manual_synchronization=True, min_offload_size=MIN,
        offload_stream=stream, backend="cuda")
    model = Stack(layers=3, hidden=256).cuda()
    x = torch.randn(2, 256, 256, device="cuda")
    reference = train_step(model, x)

    forward = te_manual_forward(ctx, sync, synchronizer, synchronizer)
    for _ in range(2):
        assert_identical(reference, train_step(model, x, forward))
    assert ctx.offloader.stats()["bytes_reloaded"] > 0
