"""The storage of a selective-offload unit's saved outputs
(recompute._Offloaded): what PyTorch's selective checkpoint stores per op
goes to the engine's loop as it is stored, leaves nothing else holding the
tensor, and comes back from the loop at every re-run that reads it (twice
with retain_graph). Runs on any torch: the loop and PyTorch's wrappers of
saved outputs are stood in for here (test_selective.py and
test_gpu_budget.py run the real ones on torch >= 2.4)."""

import gc
import weakref

import torch

from actoffload import recompute


class Loop:
    """The engine loop's pack/unpack, recorded: pack hands back a ticket."""

    def __init__(self):
        self.taken, self.unpacked = {}, []

    def pack(self, tensor):
        ticket = ("ticket", len(self.taken))
        self.taken[ticket] = tensor
        return ticket

    def unpack(self, ticket):
        self.unpacked.append(ticket)
        return self.taken[ticket].clone()  # a reload: a new tensor


class Wrapper:
    """What torch 2.4 to 2.11 store per output (`val`, `version`)."""

    def __init__(self, val):
        self.val = val
        self.version = val._version if isinstance(val, torch.Tensor) else None


class LaterWrapper:
    """What later torch stores (`value`)."""

    def __init__(self, value):
        self.value = value
        self.version = value._version if isinstance(value, torch.Tensor) else None


def test_outputs_go_to_the_loop_and_nothing_else_holds_them():
    loop = Loop()
    storage = recompute._Offloaded(loop)
    out = torch.randn(4, 4)
    alive = weakref.ref(out)
    storage.append(Wrapper(out))
    del out
    loop.taken.clear()  # the loop lets go (its copy is out): nothing else holds it
    gc.collect()
    assert alive() is None


def test_each_rerun_gets_every_output_back_in_order():
    loop = Loop()
    storage = recompute._Offloaded(loop)
    a, b = torch.randn(3), torch.randn(2, 2)
    a.add_(1)  # at version 1; its reload is at 0, which the wrapper must expect
    storage.append((Wrapper(a), Wrapper(7), None))  # a tuple output, as SDPA's
    storage.append(LaterWrapper(b))
    storage.append(b)  # a bare tensor
    assert len(loop.taken) == 3 and len(storage) == 3
    for rerun in range(2):  # backward(retain_graph=True), then again
        storage.cursor = 0  # what each re-run's context does (_Rerun)
        first, second, third = storage.pop(0), storage.pop(0), storage.pop(0)
        assert torch.equal(first[0].val, a) and first[0].val is not a
        assert first[0].version == first[0].val._version == 0
        assert first[1].val == 7 and first[2] is None
        assert torch.equal(second.value, b) and torch.equal(third, b)
        assert len(storage) == 0
    assert len(loop.unpacked) == 6  # every tensor from the loop, at each re-run


def test_selective_storage_without_a_loop_is_replayed_only():
    storage = recompute._Replayed()
    a = torch.randn(3)
    storage.append(Wrapper(a))
    for _ in range(2):
        storage.cursor = 0
        assert storage.pop(0).val is a
