"""What test_distributed_cpu.py's two-process tests share: the small
decoder-like stages (Layer, Stage, Megatron's group nesting in
layer_forward), the Groups helper, the two hand-written schedules
(ONE_F_ONE_B, INTERLEAVED) and their driver (run_iteration, train, _tag),
the deadlock_free checker, the per-rank scenarios with the checks they run
on a rank (check_delta, check_summary_table), and the two-process launcher
(run_two_ranks, _child).

The children are spawned: multiprocessing pickles _child by module name,
so it and the scenarios live here, in a module the children import by the
parent's sys.path (python/tests, put there by pytest, and python/, by
conftest.py).
"""

import contextlib
import math
import os
import pickle
import time
import traceback
from datetime import timedelta

import pytest
import torch

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover - builds without distributed
    dist = None

PP = 2
MICROBATCHES = 4
BATCH, SEQ, HIDDEN = 2, 16, 32
LAYERS_PER_STAGE = 2
MIN_ELEMENTS = 256  # the test's tensors are small (1 Ki elements a hidden state)
ITERATIONS = 3
# Every group name the layers use (SPEC §5.1): all offloaded.
GROUPS = ["attn_norm", "qkv_linear", "core_attn", "attn_proj",
          "mlp_norm", "expert_fc1", "moe_act"]
CHILD_DEADLINE_S = 45  # per test, both ranks; a hang fails after this
GLOO_TIMEOUT_S = 30

# (kind, virtual stage, microbatch) per rank.
ONE_F_ONE_B = {
    0: [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("F", 0, 2), ("B", 0, 1),
        ("F", 0, 3), ("B", 0, 2), ("B", 0, 3)],
    1: [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1), ("F", 0, 2),
        ("B", 0, 2), ("F", 0, 3), ("B", 0, 3)],
}
# Megatron's interleaved 1F1B for pp=2, vpp=2, 4 microbatches: warm-up
# forwards (pp - rank - 1) * 2 + (vpp - 1) * pp (4 on rank 0, 2 on rank 1),
# then one forward, one backward, then the cool-down backwards.
INTERLEAVED = {
    0: [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1),
        ("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1),
        ("F", 1, 2), ("B", 0, 0), ("F", 1, 3), ("B", 0, 1),
        ("B", 1, 2), ("B", 1, 3), ("B", 0, 2), ("B", 0, 3)],
    1: [("F", 0, 0), ("F", 0, 1),
        ("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1),
        ("F", 0, 2), ("B", 0, 0), ("F", 0, 3), ("B", 0, 1),
        ("F", 1, 2), ("B", 1, 2), ("F", 1, 3), ("B", 1, 3),
        ("B", 0, 2), ("B", 0, 3)],
}


# --------------------------------------------------------------------------
# The model: decoder-like layers, one stack per global pipeline stage.

class Layer(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(4 * hidden, hidden)


class Stage(torch.nn.Module):
    """Global stage `index` of `count`: the first embeds, the last has the
    head (its output is the loss)."""

    def __init__(self, index, count, hidden=HIDDEN, layers=LAYERS_PER_STAGE):
        super().__init__()
        torch.manual_seed(1000 + index)
        self.first, self.last = index == 0, index == count - 1
        self.embed = torch.nn.Linear(hidden, hidden) if self.first else None
        self.layers = torch.nn.ModuleList(Layer(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden) if self.last else None


class Groups:
    """fg.group_start / fg.group_commit, or identities without an offloader;
    `record` (a list) gets (name, bytes the commit enqueued to host)."""

    def __init__(self, fg, record=None):
        self.fg, self.record = fg, record

    def start(self, tensor, name):
        return tensor if self.fg is None else self.fg.group_start(tensor, name)

    def commit(self, tensor, name):
        if self.fg is None:
            return tensor
        before = self.fg.core.stats()["bytes_offloaded"]
        tensor = self.fg.group_commit(tensor, name)
        if self.record is not None:
            self.record.append((name, self.fg.core.stats()["bytes_offloaded"] - before))
        return tensor


def layer_forward(layer, h, g):
    """Megatron's nesting (SPEC §5.1): attn_norm opens before the input norm
    and commits after the attention's residual add, enclosing qkv_linear,
    core_attn and attn_proj; mlp_norm likewise encloses expert_fc1 and
    moe_act, whose commit is deferred past fc2."""
    h = g.start(h, "attn_norm")
    n = layer.norm1(h)
    n = g.start(n, "qkv_linear")
    qkv = g.commit(layer.qkv(n), "qkv_linear")
    qkv = g.start(qkv, "core_attn")
    q, k, v = qkv.chunk(3, dim=-1)  # views of one storage
    scores = torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    a = g.commit(scores @ v, "core_attn")
    a = g.start(a, "attn_proj")
    o = g.commit(layer.proj(a), "attn_proj")
    h = g.commit(h + o, "attn_norm")
    h = g.start(h, "mlp_norm")
    n = layer.norm2(h)
    n = g.start(n, "expert_fc1")
    u = g.commit(layer.fc1(n), "expert_fc1")
    u = g.start(u, "moe_act")
    m = layer.fc2(torch.nn.functional.gelu(u))
    m = g.commit(m, "moe_act")
    return g.commit(h + m, "mlp_norm")


def stage_forward(stage, x, fg, vstage, microbatch, record=None):
    """The forward of one chunk: the stage's output, or the loss on the last
    stage."""
    g = Groups(fg, record)
    chunk = fg.chunk(vstage, microbatch) if fg is not None else contextlib.nullcontext()
    with chunk:
        h = stage.embed(x) if stage.first else x
        for layer in stage.layers:
            h = layer_forward(layer, h, g)
        if stage.last:
            return (stage.head(h) ** 2).mean()
        return h


# --------------------------------------------------------------------------
# The hand-driven schedule.

def _tag(kind, global_stage, microbatch, iteration):
    return ((iteration * 2 + (kind == "grad")) * 64 + global_stage) * 64 + microbatch


def run_iteration(rank, stages, order, fg, iteration, record=None):
    """One iteration of `order` on this rank: activations go forward and
    gradients back with isend (never blocks) and recv; fg.finish_iteration()
    at the end. stages: {virtual stage: Stage}. Returns {microbatch: loss}
    on the rank holding the last stage."""
    count = PP * len(stages)
    peer = 1 - rank
    shape = (BATCH, SEQ, HIDDEN)
    saved, losses, sends = {}, {}, []
    for kind, vstage, mb in order:
        stage = stages[vstage]
        g_stage = vstage * PP + rank
        if kind == "F":
            if g_stage == 0:
                gen = torch.Generator().manual_seed(7919 * iteration + mb)
                x = torch.randn(shape, generator=gen)
            else:
                x = torch.empty(shape)
                dist.recv(x, src=peer, tag=_tag("act", g_stage - 1, mb, iteration))
                x.requires_grad_()
            out = stage_forward(stage, x, fg, vstage, mb, record)
            if g_stage == count - 1:
                losses[mb] = out.detach().clone()
            else:
                payload = out.detach().clone()
                sends.append((dist.isend(payload, dst=peer,
                                         tag=_tag("act", g_stage, mb, iteration)),
                              payload))
            saved[(vstage, mb)] = (x, out)
        else:
            x, out = saved.pop((vstage, mb))
            if g_stage == count - 1:
                out.backward()
            else:
                grad = torch.empty(shape)
                dist.recv(grad, src=peer, tag=_tag("grad", g_stage + 1, mb, iteration))
                torch.autograd.backward(out, grad)
            if g_stage > 0:
                payload = x.grad.clone()
                sends.append((dist.isend(payload, dst=peer,
                                         tag=_tag("grad", g_stage, mb, iteration)),
                              payload))
    assert not saved, f"chunks without a backward: {sorted(saved)}"
    for work, _ in sends:
        work.wait()
    if fg is not None:
        fg.finish_iteration()
    return losses


def make_stages(rank, vpp):
    return {v: Stage(v * PP + rank, PP * vpp) for v in range(vpp)}


def grads_of(stages):
    return [p.grad.clone() for v in sorted(stages) for p in stages[v].parameters()]


def zero_grads(stages):
    for stage in stages.values():
        for p in stage.parameters():
            p.grad = None


def train(rank, stages, order, fg, iterations=ITERATIONS, record=None):
    """[(losses, grads, bytes offloaded during the iteration)] per iteration."""
    out = []
    for i in range(iterations):
        zero_grads(stages)
        before = fg.core.stats()["bytes_offloaded"] if fg is not None else 0
        losses = run_iteration(rank, stages, order, fg, i,
                               record if i == 0 else None)
        after = fg.core.stats()["bytes_offloaded"] if fg is not None else 0
        out.append((losses, grads_of(stages), after - before))
    return out


def deadlock_free(orders):
    """Whether the ranks' orders can all run (each op's inputs produced
    before it): a forward of global stage g needs the forward of g-1 of its
    microbatch, a backward of g the backward of g+1 (and its own forward)."""
    done, pos = set(), {r: 0 for r in orders}
    count = PP * (1 + max(v for o in orders.values() for _, v, _ in o))
    progress = True
    while progress:
        progress = False
        for r, order in orders.items():
            while pos[r] < len(order):
                kind, v, mb = order[pos[r]]
                g = v * PP + r
                need = {("F", g - 1, mb)} if kind == "F" and g > 0 else set()
                if kind == "B":
                    need = {("F", g, mb)} | ({("B", g + 1, mb)} if g < count - 1 else set())
                if not need <= done:
                    break
                done.add((kind, g, mb))
                pos[r] += 1
                progress = True
    return all(pos[r] == len(o) for r, o in orders.items())


# --------------------------------------------------------------------------
# Scenarios, run in each rank's process; they return what the test checks.

def _offloader(rank, **options):
    import actoffload
    return actoffload.FineGrainedOffloader(GROUPS, min_offload_size=MIN_ELEMENTS,
                                           backend="sim", pipeline_rank=rank, **options)


def _bit_identity(rank, schedule, vpp):
    stages = make_stages(rank, vpp)
    reference = train(rank, stages, schedule[rank], None)
    fg = _offloader(rank, virtual_stages=vpp)
    got = train(rank, stages, schedule[rank], fg)
    return {"reference": [(l, g) for l, g, _ in reference],
            "got": [(l, g) for l, g, _ in got],
            "iteration_bytes": [b for _, _, b in got],
            "stats": dict(fg.core.stats()),
            "hazards": list(fg.session.hazards()),
            "warmed_up": fg.warmed_up,
            "summary": fg.summary_table()}


def scenario_one_f_one_b(rank):
    return _bit_identity(rank, ONE_F_ONE_B, vpp=1)


def scenario_interleaved(rank):
    return _bit_identity(rank, INTERLEAVED, vpp=2)


DELTA = 3 * BATCH * SEQ * HIDDEN * 4  # three hidden states' bytes


def scenario_delta(rank):
    stages = make_stages(rank, 1)
    results = {}
    for delta in (0, DELTA):
        fg = _offloader(rank, delta_offload_bytes=delta)
        record = []
        runs = train(rank, stages, ONE_F_ONE_B[rank], fg, record=record)
        results[delta] = {"iteration_bytes": [b for _, _, b in runs],
                          "summary": fg.summary_table(),
                          "max_group_bytes": max(b for _, b in record),
                          "hazards": list(fg.session.hazards())}
    gathered = [None] * PP
    dist.all_gather_object(gathered, results)
    if rank == 0:
        check_delta(gathered)
    return gathered


def check_delta(gathered):
    """On rank 0, both ranks' numbers (SPEC §5.4b): rank r keeps r x DELTA
    bytes on device by delta, at most one group over."""
    for rank, results in enumerate(gathered):
        for delta, r in results.items():
            assert r["hazards"] == [], (rank, delta, r["hazards"])
            # Every iteration after the warm-up offloads as much as the next.
            assert r["iteration_bytes"][1] == r["iteration_bytes"][2] > 0, (rank, delta, r)
    plain = [g[0]["iteration_bytes"][-1] for g in gathered]
    with_delta = [g[DELTA]["iteration_bytes"][-1] for g in gathered]
    # Rank 0 keeps 0 x DELTA: the delta changes nothing there.
    assert with_delta[0] == plain[0], (with_delta, plain)
    # Rank 1 keeps whole groups until DELTA bytes are kept (one group over
    # at most).
    kept = plain[1] - with_delta[1]
    over = gathered[1][DELTA]["max_group_bytes"]
    assert DELTA <= kept < DELTA + over, (kept, DELTA, over, plain, with_delta)
    assert with_delta[0] > with_delta[1], with_delta
    for rank, results in enumerate(gathered):
        table = results[DELTA]["summary"]
        check_summary_table(table, rank)


def check_summary_table(table, rank):
    """A non-empty table naming the groups, with this rank's row."""
    assert isinstance(table, str) and table.strip(), repr(table)
    rows = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    for name in GROUPS:
        assert name in header, (name, table)
    body = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]
    assert [row[0] for row in body] == [str(rank)], table


def _local_iteration(rank, stage, fg, microbatches):
    """One iteration of this rank's stage alone (no communication): F then
    B per microbatch, random inputs, output gradients of ones."""
    for mb in microbatches:
        x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=not stage.first)
        out = stage_forward(stage, x, fg, 0, mb)
        out.backward(None if stage.last else torch.ones_like(out))
    fg.finish_iteration()


def scenario_misuse(rank):
    import actoffload
    stages = make_stages(rank, 1)
    fg = _offloader(rank)
    train(rank, stages, ONE_F_ONE_B[rank], fg, iterations=2)  # warm-up, one more
    assert fg.warmed_up
    dist.barrier()
    # From here each rank alone, no communication: a misuse cannot leave the
    # other rank waiting.
    errors = {}
    try:
        if rank == 1:  # 3 microbatches where warm-up ran 4
            _local_iteration(rank, stages[0], fg, range(3))
        else:  # microbatch 1 where warm-up ran microbatch 0
            _local_iteration(rank, stages[0], fg, [1, 0, 2, 3])
    except Exception as error:  # noqa: BLE001 - reported to the test
        errors["error"] = (type(error).__name__,
                           isinstance(error, actoffload.OffloadError), str(error))
    dist.barrier()  # both ranks got here: neither hung
    return errors


SCENARIOS = {
    "one_f_one_b": scenario_one_f_one_b,
    "interleaved": scenario_interleaved,
    "delta": scenario_delta,
    "misuse": scenario_misuse,
}


# --------------------------------------------------------------------------
# Two processes.

def _child(rank, scenario, store, out_dir):
    result_path = os.path.join(out_dir, f"rank{rank}.pkl")
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                                world_size=PP, timeout=timedelta(seconds=GLOO_TIMEOUT_S))
        try:
            result = (SCENARIOS[scenario] if isinstance(scenario, str) else scenario)(rank)
        finally:
            dist.destroy_process_group()
        payload = ("ok", result)
    except BaseException:  # noqa: BLE001 - the test shows it
        payload = ("error", traceback.format_exc())
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump(payload, f)
    os.replace(result_path + ".tmp", result_path)
    if payload[0] != "ok":
        os._exit(1)


def run_two_ranks(scenario, tmp_path):
    """Runs `scenario` (a name in SCENARIOS, or a function of the rank
    defined at a module's top level, which the children import) on ranks 0
    and 1; [result of rank 0, of rank 1]. A child's exception fails the test
    with its traceback; a child still running at the deadline (a hang) is
    killed and fails it."""
    name = scenario if isinstance(scenario, str) else scenario.__name__
    if dist is None or not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    if not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend in this torch build")
    import multiprocessing

    from actoffload import _common
    _common.ext()  # built here, once, before both children load it
    ctx = multiprocessing.get_context("spawn")
    store = str(tmp_path / f"{name}.store")
    out_dir = tmp_path / name
    out_dir.mkdir()
    procs = [ctx.Process(target=_child, args=(rank, scenario, store, str(out_dir)),
                         daemon=True) for rank in range(PP)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + CHILD_DEADLINE_S
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            break  # one failed: the other may wait for it forever
        time.sleep(0.05)
    timed_out = time.monotonic() >= deadline
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    results, failures = [], []
    for rank in range(PP):
        path = out_dir / f"rank{rank}.pkl"
        if not path.exists():
            why = ""
            if rank in hung:
                why = (f", killed: still running after {CHILD_DEADLINE_S} s (hung)"
                       if timed_out else ", killed: still running after the other rank failed")
            failures.append(f"rank {rank}: no result (exit code {procs[rank].exitcode}{why})")
            results.append(None)
            continue
        with open(path, "rb") as f:
            status, value = pickle.load(f)
        if status != "ok":
            failures.append(f"rank {rank} raised:\n{value}")
        results.append(value)
    if failures:
        pytest.fail(f"scenario {name!r}:\n" + "\n".join(failures), pytrace=False)
    return results
