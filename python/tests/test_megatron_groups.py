"""Megatron's fine-grained groups placed on Hugging Face-style decoder
layers by hooks (actoffload.megatron_groups, SPEC §5.1), on the simulated
GPU: the layer below has Llama's submodule names and forward (q, k, v
projections before a rotary embedding, residual adds outside modules,
keyword arguments to self_attn)."""

import pytest
import torch
import torch.nn.functional as F

import actoffload
from actoffload import megatron_groups
from models import assert_identical

MIN = 64  # elements: every activation of the small layers is eligible


class Attention(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.v_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, hidden_states, cos, sin):
        b, s, h = hidden_states.shape
        shape = (b, s, self.heads, h // self.heads)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q = q * cos + torch.cat((-q[..., 1::2], q[..., ::2]), -1) * sin  # RoPE-like
        k = k * cos + torch.cat((-k[..., 1::2], k[..., ::2]), -1) * sin
        mask = torch.full((s, s), float("-inf")).triu(1)
        weights = ((q @ k.transpose(-1, -2)) / (h // self.heads) ** 0.5 + mask).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(b, s, h)
        return self.o_proj(out), weights


class MLP(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.up_proj = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.down_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(torch.nn.Module):
    """A fused expert bank as Transformers 5 has it (3-D weights, every
    expert's fc1, activation and fc2 inside one forward)."""

    def __init__(self, hidden, experts=4):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 4 * hidden, hidden) / 8)
        self.down_proj = torch.nn.Parameter(torch.randn(experts, hidden, 2 * hidden) / 8)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for expert in range(self.gate_up_proj.shape[0]):
            token, slot = torch.where(top_k_index == expert)
            if token.numel() == 0:
                continue
            gate, up = (hidden_states[token] @ self.gate_up_proj[expert].t()).chunk(2, -1)
            y = (F.silu(gate) * up) @ self.down_proj[expert].t()
            out = out.index_add(0, token, y * top_k_weights[token, slot, None])
        return out


class SparseMoE(torch.nn.Module):
    def __init__(self, hidden, experts=4, top_k=2):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(hidden, experts)
        self.top_k = top_k

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, index = self.gate(flat).softmax(-1).topk(self.top_k, -1)
        return self.experts(flat, index, weights).reshape(x.shape)


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden=32, heads=4, tuple_output=False, moe=False):
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(hidden)
        self.self_attn = Attention(hidden, heads)
        self.post_attention_layernorm = torch.nn.LayerNorm(hidden)
        self.mlp = SparseMoE(hidden) if moe else MLP(hidden)
        self.tuple_output = tuple_output

    def forward(self, hidden_states, cos=None, sin=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, cos=cos, sin=sin)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return (hidden_states, None) if self.tuple_output else hidden_states


class Decoder(torch.nn.Module):
    def __init__(self, layers=3, hidden=32, heads=4, tuple_output=False, moe=False):
        super().__init__()
        self.embed = torch.nn.Linear(hidden, hidden)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(hidden, heads, tuple_output, moe) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)
        self.head_dim = hidden // heads

    def forward(self, x):
        positions = torch.arange(x.shape[1], dtype=torch.float32)[:, None]
        angles = positions / 100 ** (torch.arange(self.head_dim) / self.head_dim)
        cos, sin = angles.cos(), angles.sin()
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, cos=cos, sin=sin)
            h = h[0] if isinstance(h, tuple) else h
        return self.head(h)


def offloaded_mb(table):
    """{group name: MB offloaded per iteration} from a one-rank summary."""
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("|") and "---" not in line]
    return dict(zip(rows[0][1:], (float(v) for v in rows[1][1:])))


def steps(model, xs, fg=None, iterations=3):
    """Per iteration: each microbatch's forward (one chunk each, numbered by
    the offloader), then their backwards in forward order; the losses and
    every gradient."""
    results = []
    for _ in range(iterations):
        for p in model.parameters():
            p.grad = None
        losses = []
        for x in xs:
            if fg is None:
                out = model(x)
            else:
                with fg.chunk(0, None):
                    out = model(x)
            losses.append((out.float() ** 2).mean())
        for loss in losses:
            loss.backward()
        if fg is not None:
            fg.finish_iteration()
        results.append((torch.stack(losses).detach(), [p.grad.clone() for p in model.parameters()]))
    return results


@pytest.mark.parametrize("tuple_output", [False, True])
def test_every_group_offloaded_on_decoder_layers_is_bit_identical(tuple_output):
    model = Decoder(tuple_output=tuple_output)
    xs = [torch.randn(2, 16, 32) for _ in range(2)]
    reference = steps(model, xs)
    fg = actoffload.FineGrainedOffloader(megatron_groups.GROUPS, min_offload_size=MIN,
                                         backend="sim")
    handles = megatron_groups.attach_groups(fg, model.layers)
    for want, got in zip(reference, steps(model, xs, fg)):
        assert_identical(want, got)
    assert fg.warmed_up
    assert fg.core.stats()["bytes_offloaded"] > 0
    assert fg.session.hazards() == []
    offloaded = offloaded_mb(fg.summary_table())
    for name in megatron_groups.GROUPS:
        assert offloaded[name] > 0, offloaded
    for h in handles:
        h.remove()
    assert_identical(reference[-1], steps(model, xs, iterations=1)[0])


def test_a_model_with_groups_attached_can_be_copied_and_saved():
    # An EMA model (copy.deepcopy, AveragedModel) or torch.save(model) of a
    # model whose layers carry the groups' hooks: the copy's hooks place
    # nothing (the offloader cannot be copied: TypeError "cannot pickle
    # 'Session' object" before), the copy trains as the model without
    # groups, and the model goes on offloading, bit for bit.
    import io
    model = Decoder()
    xs = [torch.randn(2, 16, 32) for _ in range(2)]
    reference = steps(model, xs)
    fg = actoffload.FineGrainedOffloader(megatron_groups.GROUPS, min_offload_size=MIN,
                                         backend="sim")
    megatron_groups.attach_groups(fg, model.layers)
    steps(model, xs, fg, iterations=1)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copies = [torch.optim.swa_utils.AveragedModel(model).module,
              torch.load(buffer, weights_only=False)]
    offloaded = fg.core.stats()["bytes_offloaded"]
    for copied in copies:
        hooks = [h for layer in copied.layers for m in layer.modules()
                 for h in list(m._forward_pre_hooks.values()) + list(m._forward_hooks.values())]
        assert hooks and all(h is megatron_groups._places_nothing for h in hooks)
        assert_identical(reference[-1], steps(copied, xs, iterations=1)[0])
    assert fg.core.stats()["bytes_offloaded"] == offloaded
    assert_identical(reference[-1], steps(model, xs, fg, iterations=1)[0])
    assert fg.core.stats()["bytes_offloaded"] > offloaded


def test_an_expert_bank_is_its_own_group_inside_mlp_norm():
    model = Decoder(moe=True)
    xs = [torch.randn(2, 16, 32) for _ in range(2)]
    reference = steps(model, xs)
    fg = actoffload.FineGrainedOffloader(megatron_groups.MOE_GROUPS, min_offload_size=MIN,
                                         backend="sim")
    megatron_groups.attach_groups(fg, model.layers)
    for want, got in zip(reference, steps(model, xs, fg)):
        assert_identical(want, got)
    assert offloaded_mb(fg.summary_table())["expert_fc1"] > 0
    assert fg.session.hazards() == []


@pytest.mark.parametrize("moe", [False, True])
def test_groups_nest_as_megatrons_and_hold_what_their_modules_save(moe):
    """Each group is committed once per layer per chunk, in Megatron's
    order: the three attention groups inside attn_norm, then mlp_norm
    (the expert bank's group inside it)."""
    model = Decoder(layers=2, moe=moe)
    fg = actoffload.FineGrainedOffloader(megatron_groups.MOE_GROUPS, min_offload_size=MIN,
                                         backend="sim")
    megatron_groups.attach_groups(fg, model.layers)
    commits = []

    class Recording:
        def __getattr__(self, name):
            return getattr(core, name)

        def group_commit(self, name, release):
            commits.append(name)
            return core.group_commit(name, release)
    core, fg.core = fg.core, Recording()
    steps(model, [torch.randn(2, 16, 32)], fg, iterations=1)
    per_layer = ["qkv_linear", "core_attn", "attn_proj", "attn_norm"] + (
        ["expert_fc1"] if moe else []) + ["mlp_norm"]
    assert commits == per_layer * 2


def test_outside_a_chunk_the_hooks_do_nothing():
    model = Decoder(layers=2)
    x = torch.randn(2, 16, 32)
    reference = steps(model, [x], iterations=1)[0]
    fg = actoffload.FineGrainedOffloader(megatron_groups.GROUPS, min_offload_size=MIN,
                                         backend="sim")
    megatron_groups.attach_groups(fg, model.layers)
    with torch.no_grad():
        model(x)              # eval: no chunk, no groups
    with fg.chunk(0, 0), torch.no_grad():
        model(x)              # no grad: nothing is saved, no groups
    assert_identical(reference, steps(model, [x], iterations=1)[0])
    assert fg.core.stats()["bytes_offloaded"] == 0


def test_a_layer_that_is_not_llama_style_is_named():
    model = Decoder(layers=2)
    del model.layers[1].self_attn.v_proj
    fg = actoffload.FineGrainedOffloader(["core_attn"], backend="sim")
    with pytest.raises(ValueError, match="decoder layer 1 .*v_proj"):
        megatron_groups.attach_groups(fg, model.layers)
