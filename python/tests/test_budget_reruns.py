"""Units the memory budget (budget.py) never re-runs, or re-runs otherwise
than they ran, on the CPU and the simulated GPU with a scripted probe: an
input modified in place, buffers updated (BatchNorm), an inference tensor
among the arguments (never re-run), and a model that fills a key/value
cache in training (re-run without it)."""

import copy

import pytest
import torch

from budget_testing import Decoder, Layer, make, seeded_step
from models import assert_identical


class _ScalesItsInput(Layer):
    """Begins by modifying its input in place (not idempotently: re-run
    from the scaled input, it would scale it again)."""

    def forward(self, x):
        x.mul_(0.5)
        return super().forward(x)


@pytest.mark.parametrize("allow_offload", [True, False])
def test_a_unit_that_modifies_its_input_in_place_is_never_rerun(allow_offload):
    # Re-run from its input, such a unit would start from what its forward
    # left there: torch >= 2's checkpoint refuses it in the backward, 1.13
    # silently computes other gradients. The profile sees the input's
    # version change and plans the unit kept or offloaded; the others may
    # still be recomputed.
    model = Decoder()
    _replace_middle_layers(model, _ScalesItsInput)
    _middle_layers_never_rerun(model, allow_offload)


class _Normalised(Layer):
    """Batch-normalises its input first: in training, each forward updates
    BatchNorm's running statistics and its count of batches."""

    def __init__(self, hidden):
        super().__init__(hidden)
        self.norm = torch.nn.BatchNorm1d(hidden)

    def forward(self, x):
        return super().forward(self.norm(x.transpose(1, 2)).transpose(1, 2))


@pytest.mark.parametrize("allow_offload", [True, False])
def test_a_unit_that_updates_its_buffers_is_never_rerun(allow_offload):
    # A re-run would update the running statistics a second time each step:
    # loss and gradients the same, the model's state (what an evaluation
    # reads) not. The profile sees its buffers' versions change, as for an
    # input modified in place; after every step the buffers equal those of
    # the same steps without the package.
    model = Decoder()
    _replace_middle_layers(model, _Normalised)
    plain = copy.deepcopy(model)
    _middle_layers_never_rerun(model, allow_offload, plain=plain)


def _replace_middle_layers(model, layer_class):
    """Layers 1 and 2 of a Decoder become `layer_class`, same weights (and
    its own parameters and buffers as made)."""
    for i in (1, 2):
        layer = layer_class(64)
        layer.load_state_dict(model.layers[i].state_dict(), strict=False)
        model.layers[i] = layer


def _middle_layers_never_rerun(model, allow_offload, plain=None):
    """Every step bit-identical through the profile, the race and the plan
    (and, given `plain`, a copy of the model stepped without the package,
    its buffers after each step); the profile finds layers 1 and 2 not
    recomputable, and the plan keeps or offloads them (with offload off, it
    recomputes the others)."""
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    if plain is not None:
        seeded_step(plain, x)
    ctx, _ = make(model, 0.85, allow_offload=allow_offload)
    for _ in range(8):
        assert_identical(reference, seeded_step(model, x, ctx))
        if plain is not None:
            seeded_step(plain, x)
            for (name, a), b in zip(model.named_buffers(), plain.buffers()):
                assert torch.equal(a, b), name
    joint = ctx.joint_budget
    units = [joint.profile["units"][p] for p in joint._index]
    assert [u["recomputable"] for u in units] == [True, False, False, True]
    choices = joint.unit_choices(joint.plan)
    assert choices[1] in ("keep", "offload") and choices[2] in ("keep", "offload"), choices
    assert ("recompute" in choices) if not allow_offload else set(choices) != {"keep"}, choices


class _Masked(Layer):
    """Takes a mask and adds it (not saved for backward)."""

    def forward(self, x, mask):
        return super().forward(x + mask)


class _MaskedDecoder(Decoder):
    """Layers 1 and 2 take a mask made under torch.inference_mode."""

    def __init__(self):
        super().__init__()
        _replace_middle_layers(self, _Masked)
        with torch.inference_mode():  # built once, as a cached mask may be
            self.mask = torch.full((32, 64), 0.01)

    def forward(self, x):
        x = self.embed(x)
        for i, layer in enumerate(self.layers):
            # positional: torch 1.13's hooks see no kwargs
            x = (layer(x, self.mask) if i in (1, 2) else layer(x))[0]
        return self.head(x)


@pytest.mark.parametrize("allow_offload", [True, False])
def test_an_inference_tensor_among_a_units_arguments(allow_offload):
    # Made under torch.inference_mode, it has no version counter to read
    # (the profile's check for inputs modified in place skips it), and no
    # checkpoint can save it for backward (torch >= 2 raises): the units
    # taking it are never re-run.
    _middle_layers_never_rerun(_MaskedDecoder(), allow_offload)


class _KeyValueCache:
    """Hugging Face's Cache, as a layer uses it: update(keys, values, layer)
    appends and returns every key and value the layer has seen. A model left
    with use_cache=True (its config's default) makes a fresh one each
    forward, in training too."""

    def __init__(self):
        self.layers = {}

    def update(self, keys, values, index):
        if index in self.layers:
            keys = torch.cat([self.layers[index][0], keys], dim=-2)
            values = torch.cat([self.layers[index][1], values], dim=-2)
        self.layers[index] = (keys, values)
        return keys, values

    def get_seq_length(self, index=0):
        return self.layers[index][0].shape[-2] if index in self.layers else 0


class _CachingLayer(torch.nn.Module):
    def __init__(self, index, hidden=64):
        super().__init__()
        self.index = index
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x, past_key_values=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.index)
        scores = q @ k.transpose(-1, -2) / 8.0
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(
            k.shape[-2] - q.shape[-2])
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return (x + self.out(attn @ v),)


class _CachingDecoder(torch.nn.Module):
    def __init__(self, layers=4, hidden=64):
        super().__init__()
        self.layers = torch.nn.ModuleList(_CachingLayer(i, hidden) for i in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)
        self.caches = []

    def forward(self, x):
        cache = _KeyValueCache()
        self.caches.append(cache)
        for layer in self.layers:
            x = layer(x, past_key_values=cache)[0]
        return self.head(x)


def test_a_model_that_fills_a_key_value_cache_in_training_reruns_without_it():
    # A unit's re-run in the backward must not append its keys and values to
    # the cache its forward filled (Hugging Face models with use_cache=True:
    # the re-run attended to both, and its shapes differed from the
    # forward's). The cache is left as the forward made it.
    model = _CachingDecoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, allow_offload=False)
    for _ in range(8):
        assert_identical(reference, seeded_step(model, x, ctx))
        assert all(k.shape[-2] == 32 for k, _ in model.caches[-1].layers.values())
    choices = ctx.joint_budget.unit_choices(ctx.joint_budget.plan)
    assert "recompute" in choices or "selective" in choices, choices
