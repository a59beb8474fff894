"""The memory budget at the device's edge on a real Hugging Face model
(skipped without CUDA or transformers): the process may allocate less than
the budget asks (torch.cuda.set_per_process_memory_fraction), the race's
plans run out of memory, and a loop that catches
torch.cuda.OutOfMemoryError and skips the batch settles on a plan the
device holds, every step it ran bit-identical to no offloading
(budget_edge.after_out_of_memory, JointRace::OutOfMemory)."""

import traceback

import pytest
import torch

import actoffload
from actoffload import budget
from actoffload.probe import MemoryProbe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytest.importorskip("transformers")

from test_gpu_budget import build, step  # noqa: E402


def _model(compiled=False):
    """The small Llama of test_gpu_budget.py (each layer compiled where
    asked), a batch, and its step without the context: (model, ids, loss,
    grads, peak)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build()
    if compiled:
        for layer in model.model.layers:
            layer.compile()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    step(model, ids)
    return (model, ids) + step(model, ids)


def _cap(room, above):
    """From now on the process may hold `above` (what is reserved or
    allocated now) and `room` bytes more."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((above() + room) / total)


def test_a_loop_that_skips_batches_out_of_memory_settles_on_a_plan_the_device_holds():
    model, ids, loss, grads, plain_peak = _model()
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.9)
    joint = ctx.joint_budget
    while joint.plan is None:  # the profile, with the whole device
        step(model, ids, ctx)
    # From now on the process may hold what it holds and 0.6 of the
    # no-offload peak more, where the budget asks for 0.9 of it. (`step`
    # resets the allocator's peak before each forward: after an error in the
    # backward, the budget reads what the failed step held at its units'
    # boundaries; in the forward, the peak as it raised.)
    room = int(0.6 * plain_peak)
    _cap(room, torch.cuda.memory_reserved)
    skipped, ran = 0, 0
    try:
        with pytest.warns(UserWarning, match="cannot hold that budget") as told:
            for _ in range(budget.WARMUP_ITERATIONS):
                try:
                    got_loss, got_grads, _ = step(model, ids, ctx)
                except torch.cuda.OutOfMemoryError:
                    skipped += 1
                    continue
                ran += 1
                assert torch.equal(loss, got_loss)
                assert all(torch.equal(a, b) for a, b in zip(grads, got_grads))
        print(f"skipped {skipped}, ran {ran}, room {room}; warned:",
              *sorted({str(w.message) for w in told}), ctx.budget_plan(), sep="\n")
        assert skipped >= 1 and ran > skipped, (skipped, ran, ctx.budget_plan())
        assert joint._settled, ctx.budget_plan()
        assert joint.budget_bytes <= room, (joint.budget_bytes, room)
        for _ in range(3):  # steady state: none skipped, within the budget
            got_loss, got_grads, got_peak = step(model, ids, ctx)
            assert torch.equal(loss, got_loss)
            assert got_peak <= joint.budget_bytes * 1.02, (got_peak, ctx.budget_plan())
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


@pytest.mark.parametrize("granularity,compiled", [
    ("layer", False),
    # Runs 125-127: an MLP block that began a window, after a recomputed
    # attention block, stitched at half its saved bytes (25 MB for 49): the
    # layer dropped the weights the recomputed attention had returned after
    # the MLP, and the stitch counted that as the MLP's. Windows now begin
    # one unit early (budget_windows.py).
    ("block", False),
    ("layer", True)])
def test_a_model_whose_plain_step_the_device_cannot_hold_is_profiled_in_windows(
        granularity, compiled):
    # The process may hold 0.7 of the no-offload peak above what it holds:
    # a plain step cannot run, checkpointing can. The budget's profile runs
    # windows (budget_windows.py): no step of it runs out of memory, each
    # within what the allocator could hand out, its figures one plain
    # step's. Every step is bit-identical (with each layer compiled, to the
    # compiled model).
    model, ids, loss, grads, plain_peak = _model(compiled)
    whole = actoffload.OffloadActivations(model, budget_fraction=0.5, granularity=granularity)
    while whole.joint_budget.plan is None:  # the profile with the whole device
        step(model, ids, whole)
    want = [whole.joint_budget.profile["units"][p] for p in whole.joint_budget._index]
    room = int(0.7 * plain_peak)
    # The limit is on what the allocator reserves: 0.7 of the peak above
    # what is allocated now (blocks left partly used stay reserved).
    _cap(room, torch.cuda.memory_allocated)
    try:
        # What the allocator can still hand out cannot hold a plain step (the
        # step itself may or may not fail: blocks a test before left
        # partly used count in the process's limit but can serve it; run
        # 123).
        free = MemoryProbe().room()
        assert free < plain_peak, (free, plain_peak)
        # The budget leaves the allocator's fragmentation room: at 0.6 of
        # the peak, a race plan that offloads, measured within it, failed
        # to find 32 MiB with 153 MiB reserved but unused (run 120).
        ctx = actoffload.OffloadActivations(model, budget_bytes=int(0.45 * plain_peak),
                                            granularity=granularity)
        joint = ctx.joint_budget
        iterations, lost = 0, 0
        while joint.plan is None:
            iterations += 1
            try:
                got_loss, got_grads, got_peak = step(model, ids, ctx)
            except torch.cuda.OutOfMemoryError:
                # Run 131 (one in four runs since windows hold half the
                # room): a window's backward found no 32 MiB block with 95
                # MiB reserved but unused and 90 MiB below the limit. It
                # runs again smaller (SPEC 7.10).
                lost += 1
                continue
            assert got_peak <= free, (got_peak, free)  # the windows held
            assert torch.equal(loss, got_loss)
            assert all(torch.equal(a, b) for a, b in zip(grads, got_grads))
        assert lost <= 1, lost
        got = [joint.profile["units"][p] for p in joint._index]
        print(f"plain peak {plain_peak}, room {free}, profile iterations {iterations} "
              f"(out of memory: {lost}) "
              f"(with the whole device: {whole.joint_budget.iteration})",
              "saved bytes, windows / whole device:",
              [(g["saved_bytes"], w["saved_bytes"]) for g, w in zip(got, want)],
              "forward transients:",
              [(g["forward_transient_bytes"], w["forward_transient_bytes"])
               for g, w in zip(got, want)],
              "backward transients:",
              [(g["backward_transient_bytes"], w["backward_transient_bytes"])
               for g, w in zip(got, want)],
              "windows:", *joint._profiles[0].get("windows", []), ctx.budget_plan(), sep="\n")
        # The race at the device's edge: a plan measured within the budget
        # may still find no block for a reload among those the allocator
        # holds unused (run 124: 100 MiB asked, 235 MiB reserved but
        # unused), and this loop skips that batch (SPEC 7.9).
        skipped = 0
        for _ in range(budget.WARMUP_ITERATIONS):
            try:
                got_loss, got_grads, got_peak = step(model, ids, ctx)
            except torch.cuda.OutOfMemoryError:
                skipped += 1
                continue
            assert torch.equal(loss, got_loss)
            assert all(torch.equal(a, b) for a, b in zip(grads, got_grads))
        print(f"race steps skipped: {skipped}", ctx.budget_plan(), sep="\n")
        assert skipped < budget.WARMUP_ITERATIONS // 4
        assert iterations > whole.joint_budget.iteration  # windows
        assert joint._settled, ctx.budget_plan()
        for g, w in zip(got, want):  # one plain step's figures
            # (within three of the allocator's 2 MiB blocks: run 123, 3 MiB of
            # 100; runs 151 and 155, 4.2 and 5.0 MB of 121 to 127 where two
            # blocks were allowed: the capped allocator splits and rounds
            # blocks otherwise)
            assert abs(g["saved_bytes"] - w["saved_bytes"]) <= max(0.02 * w["saved_bytes"],
                                                                   6 << 20)
        for _ in range(3):  # steady state: within the budget
            _, _, got_peak = step(model, ids, ctx)
            assert got_peak <= joint.budget_bytes * 1.02, (got_peak, ctx.budget_plan())
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def _skipping(model, ids, ctx, steps, want, room):
    """`steps` steps of `ids`, each skipped where the device runs out of
    memory, each that ran bit-identical to `want` (loss, grads) and within
    `room`: (the choices each step that ran ran; (choices, predicted peak)
    of each that failed in the model's forward or after it; where those
    that failed before it raised)."""
    joint = ctx.joint_budget
    in_force = []  # per step, the plan its forward ran and its predicted peak
    hook = model.register_forward_pre_hook(lambda module, args: in_force.__setitem__(
        -1, (tuple(joint.plan["choice"]), joint.plan["peak_bytes"])))
    ran, failed, before = [], [], []
    try:
        for _ in range(steps):
            in_force.append(None)
            held = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
            try:
                got_loss, got_grads, got_peak = step(model, ids, ctx)
            except torch.cuda.OutOfMemoryError as e:
                where = [f"{f.name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)]
                if in_force[-1] is None:  # before the model's forward: no plan's
                    before.append(where)
                else:
                    failed.append(in_force[-1])
                    print("failed:", *in_force[-1], "raised in", where[-3:],
                          "allocated, reserved before it:", *held)
                continue
            ran.append(in_force[-1][0])
            assert torch.equal(want[0], got_loss)
            assert all(torch.equal(a, b) for a, b in zip(want[1], got_grads))
            assert got_peak <= room
            # Not held through the next step: the cap counted no copy of
            # the gradients beside the model's own, and a copy kept alive
            # leaves the next step that much less room (run 149: the
            # smallest plan's steps failed at their own copy, 13 times).
            del got_loss, got_grads
    finally:
        hook.remove()
    return ran, failed, before


def test_after_the_warm_up_a_plan_the_device_no_longer_holds_gives_way():
    # The race settled; then memory beside the model grows (an optimizer's
    # state first allocated after the warm-up, say): the process may hold
    # 0.9 of the settled plan's peak above what it holds. A loop that skips
    # the batch goes on with a plan predicted to hold less
    # (budget_edge.SteadyWatch, steady_out_of_memory, JointRace::OutOfMemory),
    # bit-identical. Run 128: a plan that gave way ran for 6 steps, then
    # failed too (the allocator's blocks: what it reserved crept from 580 to
    # 696 MB of a 705 MB limit over identical steps), and the next,
    # predicted to hold more, failed at every step. Runs 132-134: the plan
    # put in force as one gave way failed in that very forward, unmeasured,
    # and the race's measurements that began at the next forward forgot it:
    # it ran again and failed a second time.
    model, ids, loss, grads, _ = _model()
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
    joint = ctx.joint_budget
    while joint.plan is None or joint.measuring:
        step(model, ids, ctx)
    kept_peak = max(step(model, ids, ctx)[2] for _ in range(2))
    kept = tuple(joint.plan["choice"])
    room = int(0.9 * kept_peak)
    _cap(room, torch.cuda.memory_allocated)
    try:
        with pytest.warns(UserWarning, match="cannot hold that budget"):
            ran, failed, before = _skipping(model, ids, ctx, 14, (loss, grads), room)
        print(f"kept {kept} at {kept_peak}; room {room}; failed {failed}; ran {ran}",
              "raised before the model's forward:", *before, ctx.budget_plan(), sep="\n")
        assert failed and failed[0][0] == kept
        assert 1 <= len(failed) <= 4 and len(ran) >= 10
        assert kept not in ran
        for (_, peak), (_, later) in zip(failed, failed[1:]):
            assert later < peak  # each gave way to one predicted lower
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def test_after_the_warm_up_a_plan_for_longer_batches_the_device_no_longer_holds_gives_way():
    # After the warm-up on 1024 tokens, batches of 1280 run a plan made for
    # them (budget_lengths); then the process may hold 0.9 of that plan's
    # peak above what it holds. A loop that skips the batch goes on with a
    # plan for 1280 predicted to hold less (LongerBatches.out_of_memory,
    # the engine's PlanForLengthBelow, at least an eighth lower), bit-identical.
    # Where those fail too, the plan whose steps ran comes back. Before,
    # only the race's own plan gave way: every step of 1280 failed. (Run
    # 134: the plan for 1280 was predicted at 431 MB and peaked at 566; run
    # 135: the smallest, predicted lowest, failed at every step where one
    # predicted higher had run.)
    model, ids, _, _, _ = _model()
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6)
    joint = ctx.joint_budget
    while joint.plan is None or joint.measuring:
        step(model, ids, ctx)
    longer = torch.randint(0, 1000, (2, 1280), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(1))
    want = step(model, longer)[:2]
    step(model, longer, ctx)
    assert joint.plan.get("for_ratio") == pytest.approx(1.25), ctx.budget_plan()
    kept_peak = max(step(model, longer, ctx)[2] for _ in range(2))
    kept = tuple(joint.plan["choice"])
    room = int(0.9 * kept_peak)
    _cap(room, torch.cuda.memory_allocated)
    try:
        with pytest.warns(UserWarning, match="the device cannot hold that plan") as told:
            ran, failed, before = _skipping(model, longer, ctx, 14, want, room)
        said = sorted({str(w.message) for w in told})
        print(f"kept {kept} at {kept_peak}; room {room}; failed {failed}; ran {ran}",
              "raised before the model's forward:", *before, *said, ctx.budget_plan(),
              sep="\n")
        assert failed and failed[0][0] == kept
        assert kept not in ran
        for (_, peak), (choice, later) in zip(failed, failed[1:]):
            # each gave way to one predicted lower, or to one whose steps ran,
            # or the smallest for that length runs on
            assert later < peak or choice in ran or later == failed[-1][1]
        # Steps ran from the plans given way to; or, where the allocator
        # failed each of them (runs 138-143: with eager attention at 1280
        # tokens every plan failed in the forward, its reserved blocks
        # fragmented, 0.9 of the kept plan's peak left to it), the smallest
        # for that length was reached and said so.
        smallest = any("no plan for them is predicted to hold less" in m for m in said)
        assert (len(failed) <= 6 and len(ran) >= 8) or smallest, said
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
