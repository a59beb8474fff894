"""A DTensor activation (tensor parallelism) is offloaded as its local shard
and rebuilt with the same mesh, placements, shape and stride; a DTensor
parameter, or a view of one, is never offloaded (SPEC §7.5). On CPU torch a
stand-in class plays torch.distributed.tensor.DTensor (the package finds
DTensor through that module); the real one runs in fsdp_bench --parallel tp
on two GPUs."""

import sys
import types

import pytest
import torch

import actoffload
from models import assert_identical

MIN = 64


class FakeDTensor(torch.Tensor):
    """Carries a mesh and placements; to_local() is its plain storage."""
    device_mesh = "mesh-of-2"
    placements = ("Shard(1)",)
    rebuilt = []

    def to_local(self):
        return self.as_subclass(torch.Tensor).detach()  # as DTensor: no grad

    @classmethod
    def from_local(cls, local, mesh, placements, run_check, shape, stride):
        assert (mesh, placements, run_check) == (cls.device_mesh, cls.placements, False)
        assert tuple(local.shape) == tuple(shape) and tuple(local.stride()) == tuple(stride)
        cls.rebuilt.append(tuple(shape))
        return local.as_subclass(cls)


@pytest.fixture
def fake_dtensor(monkeypatch):
    module = types.ModuleType("torch.distributed.tensor")
    module.DTensor = FakeDTensor
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", module)
    FakeDTensor.rebuilt = []
    return FakeDTensor


def forward(x, w, w_dt):
    h = x.as_subclass(FakeDTensor) @ w  # saves the input, a DTensor activation
    h = h @ w                           # saves h (and w, a parameter: kept)
    return (h @ w_dt).as_subclass(torch.Tensor)  # saves h; w_dt, a DTensor weight: kept


def step(door, x, w, w_dt):
    for p in (w, w_dt):
        p.grad = None
    with door:
        out = forward(x, w, w_dt)
    loss = (out ** 2).mean()
    loss.backward()
    return loss.detach().clone(), [w.grad.clone(), w_dt.grad.clone()]


def tensors():
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    w = torch.nn.Parameter(torch.randn(64, 64) / 8)
    w_dt = torch.Tensor._make_subclass(FakeDTensor, torch.randn(64, 64) / 8, True)
    return x, w, w_dt


def test_the_loop_offloads_a_dtensor_activation_as_its_local_shard(fake_dtensor):
    x, w, w_dt = tensors()
    reference = step(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
                     x, w, w_dt)
    door = actoffload.OffloadActivations(min_offload_size=MIN, backend="sim")
    assert_identical(reference, step(door, x, w, w_dt))
    # Three 32 x 64 float activations; not the DTensor weight.
    assert door.offloader.dtensor_shard_bytes == 3 * 32 * 64 * 4
    assert fake_dtensor.rebuilt == [(32, 64)] * 3


def test_the_fine_grained_filter_offloads_a_dtensor_activation_as_its_shard(fake_dtensor):
    x, w, w_dt = tensors()
    reference = step(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
                     x, w, w_dt)
    fg = actoffload.FineGrainedOffloader(["layer"], min_offload_size=MIN, backend="sim")

    for p in (w, w_dt):
        p.grad = None
    with fg.chunk(0, 0):
        start = fg.group_start(torch.zeros((), requires_grad=True), "layer")
        out = forward(x + start, w, w_dt)
        out = fg.group_commit(out, "layer")
    loss = (out ** 2).mean()
    loss.backward()
    fg.finish_iteration()
    assert_identical(reference, (loss.detach(), [w.grad.clone(), w_dt.grad.clone()]))
    assert fg.core.stats()["bytes_offloaded"] == 3 * 32 * 64 * 4
    assert fake_dtensor.rebuilt == [(32, 64)] * 3


def test_without_the_dtensor_module_a_subclass_is_kept(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed.tensor", raising=False)
    x, w, w_dt = tensors()
    door = actoffload.OffloadActivations(min_offload_size=MIN, backend="sim")
    step(door, x, w, w_dt)
    assert door.offloader.dtensor_shard_bytes == 0
