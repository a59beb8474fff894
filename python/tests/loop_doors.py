"""What test_training_loops.py and test_training_loop_misuse.py share: the
front doors each case runs over, the loop without the package to compare
with, and the layers of the cases."""

import contextlib
import gc
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import actoffload
from actoffload.torchtune_compat import NoOpManager, get_act_offloading_ctx_manager
from models import Block, Stack

MIN = 1024          # TE: elements
MIN_BYTES = 4096    # OffloadActivations: bytes
SHAPE = (2, 32, 64)  # batch, sequence, hidden (64): small, still over MIN

ALL_DOORS = ["te", "oa_layers", "oa_model", "oa_noarg", "oa_budget"]
LAYER_DOORS = ["te", "oa_layers", "oa_model", "oa_budget"]


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
        if kind == "oa_budget":
            self.ctx = _settled_budget(model)
            self.session = self.ctx.session
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
    def offloader(self):
        # A budget's plan makes a loop of its own (budget.JointBudget._apply).
        return self.ctx.offloader if self.kind == "oa_budget" else self._offloader

    @offloader.setter
    def offloader(self, loop):
        self._offloader = loop

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


def _settled_budget(model):
    """OffloadActivations(layers, budget_fraction=0.5) on a scripted device
    (budget_testing.ScriptedProbe), its profile and warm-up run on the
    model, then a plan that offloads the first layer, recomputes the second
    and keeps the rest (budget_testing.forced_plan): the cases then run
    the budget's plan in force, each bit-identical."""
    from budget_testing import ScriptedProbe, forced_plan
    probe = ScriptedProbe(1 << 20, outside=1 << 20)
    ctx = actoffload.OffloadActivations(
        layers=model.layers, budget_fraction=0.5, probe=probe, backend="sim",
        min_offload_size=MIN_BYTES)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(99))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(60):
            try:
                zero_grads(model)
                with ctx:
                    out = model.head(_layers_of(model, model.embed(x)))
                loss_of(out).backward()
            except ValueError:
                continue  # refused once: the smallest that fits is planned
            if not ctx.joint_budget.measuring and ctx.joint_budget.refusal is None:
                break
    budget = ctx.joint_budget
    assert not budget.measuring
    # (A layer that modifies its input in place is never re-run: kept.)
    second = "recompute" if budget._recomputable(1) else "keep"
    budget._apply(forced_plan(budget, {0: "offload", 1: second}))
    zero_grads(model)
    return ctx


def _layers_of(model, h):
    """The layers' forward; a layer's tuple or dict output passes its first
    tensor on."""
    for layer in model.layers:
        h = layer(h)
        if isinstance(h, dict):
            h = list(h.values())
        if isinstance(h, (tuple, list)):
            h = next(v for v in h if isinstance(v, torch.Tensor))
    return h


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
