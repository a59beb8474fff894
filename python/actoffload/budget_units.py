"""The budget's units and how the engine moves them (budget.py): which
modules are units (a decoder layer, or its attention and MLP blocks), and
the schedule table (SPEC §4.2) that releases and reloads the offloaded
ones where the joint plan's model does."""

# Names of the attention and MLP blocks inside a decoder layer (Hugging Face
# Llama, Qwen2, Qwen2-MoE, Mistral; GPT-2; Bloom and Falcon's self_attention;
# torchtune).
_BLOCK_NAMES = ("self_attn", "self_attention", "attn", "attention", "mlp",
                "block_sparse_moe", "feed_forward", "ffn")
# A layer is split into its named blocks only where they hold at least this
# share of its parameters. Elsewhere the rest would be glue, which the plan
# can neither offload nor recompute: OPT's MLP is two Linear children of the
# layer and no module of its own, so its blocks would be its attention alone.
_BLOCKS_COVER = 0.9


def find_units(layers, granularity):
    """The units, in forward order: the layers themselves ("layer"), or each
    layer's attention and MLP blocks ("block"; a layer without them, or
    whose blocks hold less than _BLOCKS_COVER of its parameters, is its own
    unit)."""
    if granularity == "layer":
        return list(layers)
    if granularity != "block":
        raise ValueError(f"granularity must be 'layer' or 'block', got {granularity!r}")
    units = []
    for layer in layers:
        blocks = [child for name, child in layer.named_children()
                  if name in _BLOCK_NAMES]
        total = _parameter_count(layer)
        covered = sum(_parameter_count(block) for block in blocks)
        units.extend(blocks if blocks and covered >= _BLOCKS_COVER * total else [layer])
    return units


def _parameter_count(module):
    return sum(p.numel() for p in module.parameters())


# The plan's choices whose units the engine offloads.
OFFLOADED = ("offload", "selective-offload")


def schedule_for(plan, index):
    """The schedule table (SPEC §4.2) of the units' engine layers, as the
    plan's model moves them; index[u] is unit u's place in the plan (glue
    and the head are its other units). An offloaded unit is released when
    the unit that needs its room begins its forward, and reloaded when the
    backward of the unit the model reloads it beside begins. Glue and the
    head have no steps of their own in the engine: a release the model
    makes during them comes as the next unit begins (the last, for the
    head), a reload as the backward of the unit before them begins."""
    n = len(index)
    table = {}
    for unit, place in enumerate(index):
        if plan["choice"][place] not in OFFLOADED:
            continue
        during = plan["released_during"][place]
        release = next((u for u, q in enumerate(index) if q >= during), n - 1) + 1
        during = plan["reloaded_during"][place]
        beside = next((u for u in reversed(range(n)) if index[u] <= during), 0)
        table[unit] = (True, min(release, n), False, max(n - beside, 1))
    return table


def plan_key(plan, index):
    """What makes two plans run alike: their choices and their engine
    schedule. The planner may give the same choices for a lower budget on
    another schedule (an offloaded unit released earlier or reloaded
    later: a lower peak for the same units), and that one runs a loop of
    its own."""
    return tuple(plan["choice"]), tuple(sorted(schedule_for(plan, index).items()))
