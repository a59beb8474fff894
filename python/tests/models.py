"""Small models for the tests: a transformer block in plain PyTorch whose
attention saves transposed and split views of one qkv storage (the layouts
that upstream TE cannot offload), and a helper that runs a training step
and returns the loss and every parameter gradient."""

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        qkv = self.qkv(self.norm1(x))
        # Views of one storage, transposed: (b, heads, s, d), non-contiguous.
        q, k, v = qkv.view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / (h // self.heads) ** 0.5
        attn = scores.softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stack(torch.nn.Module):
    def __init__(self, layers=4, hidden=64):
        super().__init__()
        self.embed = torch.nn.Linear(hidden, hidden)
        self.layers = torch.nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)

    def forward(self, x, layer_wrapper=None):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x) if layer_wrapper is None else layer_wrapper(layer, x)
        return self.head(x)


def train_step(model, x, forward=None):
    """loss and [grad of each parameter] of one forward and backward."""
    for p in model.parameters():
        p.grad = None
    out = model(x) if forward is None else forward(model, x)
    loss = (out.float() ** 2).mean()
    loss.backward()
    return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]


def assert_identical(reference, got):
    loss, grads = reference
    assert torch.equal(loss, got[0]), (loss, got[0])
    assert len(grads) == len(got[1])
    for i, (a, b) in enumerate(zip(grads, got[1])):
        assert torch.equal(a, b), f"gradient {i} differs"


def te_manual_forward(ctx, sync, synchronizer, releaser, offloaded=2):
    """A forward for train_step with TE's manual synchronization, as TE's
    example drives it: the first `offloaded` layers' offloads start after
    their forward, their memory is released (through `releaser`: the
    synchronizer or the sync function, which both offer the calls) after the
    last layer's, and their reloads start before the head, in reverse."""
    def forward(model, x):
        h = model.embed(x)
        for i, layer in enumerate(model.layers):
            with ctx:
                h = layer(h)
            h = sync(h)
            if i < offloaded:
                synchronizer.start_offload_layer(i)
        for i in range(offloaded):
            releaser.release_activation_forward_gpu_memory(i)
        for i in reversed(range(offloaded)):
            synchronizer.start_reload_layer(i)
        return model.head(h)
    return forward


def te_forward(ctx, sync):
    """A forward for train_step written as a TE user writes it: each layer
    inside the context, its output through the sync function."""
    def forward(model, x):
        def wrapped(layer, h):
            with ctx:
                h = layer(h)
            return sync(h)
        return model(x, layer_wrapper=wrapped)
    return forward


def smallest_budget(make_ctx, model, x):
    """The smallest byte budget the engine's plan (SPEC §4.7) fits for
    `model` on `x`, as its refusal of a one-byte budget names it.
    `make_ctx(budget_bytes)` makes the OffloadActivations. The number
    depends on what the torch version saves, so tests that must not be
    refused ask for at least this."""
    import re
    ctx = make_ctx(1)
    for _ in range(2):
        try:
            train_step(model, x, whole_forward(ctx))
        except ValueError as refusal:
            found = re.search(r"smallest budget that fits this workload is (\d+)",
                              str(refusal))
            assert found, refusal
            return int(found.group(1))
    raise AssertionError("a budget of one byte was not refused")


def whole_forward(ctx):
    """A forward for train_step with the whole model inside the context
    (torchtune's usage)."""
    def forward(model, x):
        with ctx:
            return model(x)
    return forward


def recorded_bytes(model, x, **options):
    """The bytes the engine's byte budget (SPEC §4.7, no layers) records as
    saved in one step of `model` on `x`: its plan under a budget that never
    binds lists every unit. `options` go to OffloadActivations."""
    import actoffload
    ctx = actoffload.OffloadActivations(budget_bytes=1 << 40, **options)
    train_step(model, x, whole_forward(ctx))
    rows = [line.split() for line in ctx.budget_plan().splitlines()]
    return sum(int(row[2]) for row in rows if row and row[0].isdigit())
