"""OffloadActivations(model, budget_bytes=...) with a memory probe: the
joint keep / offload / recompute plan (SPEC §4.8, §7.8; budget.py) on the
CPU and the simulated GPU. The probe here is scripted (CPU tensors have no
allocator counters: budget_testing.ScriptedProbe). The GPU tests
(test_gpu_budget.py) measure for real; training-loop patterns are in
test_budget_loops.py."""

import warnings

import pytest
import torch

import actoffload
from actoffload import _common, budget, budget_profile, recompute
from actoffload.probe import Clock
from budget_testing import (KEPT_RECORD, UNIT, Decoder, ScriptedProbe, kept_trial, make,
                            profile, seeded_step)
from models import assert_identical


def test_checkpoint_only_plan_recomputes_and_stays_bit_identical(monkeypatch):
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.6, allow_offload=False)
    # Profiled kept, selectively where the torch version can, then every
    # unit recomputed in full (what its forward holds while it runs).
    assert profile(model, x, ctx, reference) == 2 + recompute.selective_available()
    units = [ctx.joint_budget.profile["units"][p] for p in ctx.joint_budget._index]
    assert all("recompute_forward_transient_bytes" in u for u in units), units
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    choice = ctx.joint_budget.plan["choice"]
    assert "recompute" in choice and "offload" not in choice, choice
    assert ctx.budget_plan().count("recompute") >= choice.count("recompute")
    # Outside the context the units run their own forwards, without
    # checkpoint; inside, the plan's recomputed units run under it.
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    model(x).sum().backward()
    assert calls == []
    recomputed = ctx.joint_budget.unit_choices(ctx.joint_budget.plan).count("recompute")
    with ctx:
        out = model(x)
    assert len(calls) == recomputed > 0
    out.sum().backward()


def test_offload_only_plan_offloads_on_the_simulated_gpu():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.7, allow_recompute=False)
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    choice = ctx.joint_budget.plan["choice"]
    assert "offload" in choice and "recompute" not in choice, choice
    assert ctx.offloader.stats()["bytes_offloaded"] > 0
    # The limit (engine/plan/joint_limit.h) never exceeds the plan's prediction.
    limit = ctx.joint_budget.limit()
    assert 0 < limit <= ctx.joint_budget.plan["step_ns"]
    assert ctx.session.hazards() == []


def test_blocks_are_units_and_mixed_plans_stay_bit_identical():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, granularity="block")
    assert [type(u).__name__ for u in ctx.joint_budget.units] == ["Attention", "Mlp"] * 4
    for _ in range(5):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert set(ctx.joint_budget.plan["choice"]) != {"keep"}
    with pytest.raises(ValueError, match="granularity"):
        actoffload.OffloadActivations(model, budget_bytes=1 << 20, probe=ScriptedProbe(1, 1),
                                      granularity="op", backend="sim")


def test_a_layer_is_split_only_where_its_blocks_hold_its_parameters():
    # Bloom and Falcon name their attention self_attention; OPT's MLP is two
    # Linear children of the layer, no module of its own: split, its
    # attention alone would be a unit and the MLP glue the plan can neither
    # offload nor recompute, so the layer stays whole.
    class Bloomish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attention = torch.nn.Linear(64, 192)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
            self.post_attention_layernorm = torch.nn.LayerNorm(64)

    class Optish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Linear(64, 192)
            self.fc1 = torch.nn.Linear(64, 256)
            self.fc2 = torch.nn.Linear(256, 64)

    bloom, opt = Bloomish(), Optish()
    units = budget.find_units([bloom, opt, bloom], "block")
    assert units == [bloom.self_attention, bloom.mlp, opt, bloom.self_attention, bloom.mlp]
    assert budget.find_units([bloom, opt], "layer") == [bloom, opt]


def test_what_code_between_units_leaves_is_glue_the_plan_counts():
    # Blocks leave norms and residual adds between them: glue, one more
    # unit of the plan each, neither offloaded nor recomputed, and counted
    # in the plan's peak.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    probe = ScriptedProbe(UNIT, outside=0, glue=UNIT // 2)
    ctx = actoffload.OffloadActivations(model, budget_fraction=0.6, probe=probe,
                                        granularity="block", backend="sim",
                                        min_offload_size=1024)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    for _ in range(4):
        assert_identical(reference, seeded_step(model, x, ctx))
    joint = ctx.joint_budget
    units = joint.profile["units"]
    assert len(units) == 8 + 7 + 1  # blocks, glue between them, the head
    glue = [u for i, u in enumerate(units[:-1]) if i not in joint._index]
    assert [u["saved_bytes"] for u in glue] == [UNIT // 2] * 7
    assert all(not u["offloadable"] and not u["recomputable"] for u in glue)
    assert all(joint.plan["choice"][i] == "keep" for i in range(15) if i not in joint._index)
    assert len(joint.unit_choices(joint.plan)) == 8
    # Without the glue the plan would need 3.5 units less.
    assert joint.plan["peak_bytes"] >= 7 * (UNIT // 2)


def test_a_budget_no_plan_fits_is_refused_once_naming_the_smallest():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    probe = ScriptedProbe(UNIT, outside=UNIT)
    ctx = actoffload.OffloadActivations(model, budget_bytes=UNIT // 2, probe=probe,
                                        backend="sim", min_offload_size=1024)
    probe.ctx = ctx
    probe.watch(ctx.joint_budget.units)
    profile(model, x, ctx, reference)
    with pytest.raises(ValueError, match=r"smallest that fits is \d+ bytes"):
        seeded_step(model, x, ctx)
    for _ in range(3):  # planned for the smallest: runs, bit-identical
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ctx.joint_budget.plan is not None


def test_a_measured_peak_over_the_budget_lowers_the_plan():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8)
    profile(model, x, ctx)
    joint = ctx.joint_budget
    first_budget = joint._units_budget
    # Every candidate's peak reads at least half a unit over.
    lowest = min(p["peak_bytes"] for p in [joint.plan] + joint.candidates)
    probe.over = joint.budget_bytes - lowest + UNIT // 2
    rounds = 1 + len(joint.candidates)  # every candidate over: then lowered
    for _ in range(rounds * budget.RUNS_PER_CANDIDATE):
        seeded_step(model, x, ctx)
    probe.over = 0
    # Planned anew for less: the plan in force fits the lowered share.
    assert joint.plan["peak_bytes"] <= joint._units_budget < first_budget - UNIT // 2


def test_what_recomputed_units_hold_beyond_the_profile_is_measured_and_planned():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.6, allow_offload=False)
    profile(model, x, ctx, reference)
    joint = ctx.joint_budget
    assert joint.excess == (0, 0)
    probe.per_recompute = UNIT // 4  # each recomputed unit holds a quarter more
    while joint.measuring:
        assert_identical(reference, seeded_step(model, x, ctx))
    assert joint.excess[0] == UNIT // 4
    profiled = {i: u["input_bytes"] for i, u in enumerate(joint.profile["units"])
                if u["recomputable"]}
    assert profiled and all(joint.model_units[i]["input_bytes"] == min(
        b + UNIT // 4, joint.model_units[i]["saved_bytes"]) for i, b in profiled.items())
    assert f"{UNIT // 4} bytes per recomputed unit" in ctx.budget_plan()
    # The kept plan fits as measured; the prediction and the limit are the
    # fitted units'.
    assert probe.peak() <= joint.budget_bytes
    assert joint.limit() <= joint.predicted_step(joint.plan)


def test_where_no_plan_can_be_lowered_enough_the_lowest_measured_is_kept():
    # ... and the caller's budget is refused once at the next forward
    # (SPEC §7.8), naming that plan's measured peak, which becomes the budget.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, probe = make(model, 0.8)
    profile(model, x, ctx)
    joint = ctx.joint_budget
    asked = joint.budget_bytes
    probe.over = 50 * UNIT  # far over, whatever the plan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while joint.measuring:
            assert_identical(reference, seeded_step(model, x, ctx))
    assert not [w for w in caught if "measured" in str(w.message)]  # refused, not warned
    probe.over = 0
    lowest = min(joint._all_trials, key=lambda t: (t[1], t[0]))
    assert joint.plan["choice"] == lowest[2]["choice"]
    assert joint.budget_bytes == lowest[1] > asked
    with pytest.raises(ValueError, match=f"a budget of {asked} bytes cannot be kept as "
                       f"measured.*the smallest that fits as measured is {lowest[1]} bytes"):
        seeded_step(model, x, ctx)
    for _ in range(2):  # once
        assert_identical(reference, seeded_step(model, x, ctx))


def test_warm_up_runs_each_candidate_and_keeps_one_that_fits(monkeypatch):
    # Every candidate runs: the CPU's steps follow no model of the plan, so
    # pruning (budget.PRUNE) would drop a varying number of them.
    monkeypatch.setattr(budget, "PRUNE", 1e9)
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, outside=0)
    joint = ctx.joint_budget
    for _ in range(budget.WARMUP_ITERATIONS + 2):
        assert_identical(reference, seeded_step(model, x, ctx))
    assert len(joint.trials) >= 2  # the joint plan and at least one other
    assert not joint.measuring
    assert joint.plan["choice"] == kept_trial(joint.trials, joint.budget_bytes)[2]["choice"]
    # The loops of the plans raced are dropped once their graphs are gone.
    assert len(joint._retired) <= 1 < len(joint._all_trials)


def test_a_trial_predicted_faster_and_measured_a_little_slower_runs_again(monkeypatch):
    # The race's rematch (budget.REMATCH; engine JointRaceOptions::rematch).
    # The plan the model predicts fastest measures 10% slower than the
    # others in its trial (a step slow for reasons of the moment); before
    # the race settles it runs again, then the plan the race would keep, and
    # it measures faster and is kept. Every step bit-identical, through the
    # switches back to plans raced before.
    monkeypatch.setattr(budget, "PRUNE", 1e9)  # every candidate runs
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.5, outside=0)
    profile(model, x, ctx, reference)
    joint = ctx.joint_budget
    joint._race.calibrated = True  # the scripted steps follow no bandwidth
    plans = [joint.plan] + joint.candidates
    predicted = sorted(joint.predicted_step(p) for p in plans)
    assert len(plans) >= 2 and predicted[0] < predicted[1]
    fastest = tuple(min(plans, key=joint.predicted_step)["choice"])
    ran = []

    def step_ns(record):
        choice = tuple(joint.plan["choice"])
        if not joint._settled:
            ran.append(choice)
        if choice != fastest:
            return 1e6
        return 1.1e6 if ran.count(fastest) <= budget.RUNS_PER_CANDIDATE else 0.9e6
    monkeypatch.setattr(joint._recorder, "step_ns", step_ns)
    while joint.measuring:
        assert_identical(reference, seeded_step(model, x, ctx))
    assert ran.count(fastest) == budget.RUNS_PER_CANDIDATE + budget.REMATCH_RUNS
    # After the candidates' runs, the rematch: the fastest predicted first,
    # the plan that would have been kept (another) last, each plan there
    # REMATCH_RUNS times in a row.
    again = budget.REMATCH_RUNS
    start = [k for k, c in enumerate(ran) if c == fastest][budget.RUNS_PER_CANDIDATE]
    rematch = ran[start:]
    assert len(rematch) % again == 0 and len(rematch) >= 2 * again, ran
    blocks = [rematch[k:k + again] for k in range(0, len(rematch), again)]
    assert all(len(set(b)) == 1 for b in blocks), ran
    assert blocks[0][0] == fastest != blocks[-1][0], ran
    assert tuple(joint.plan["choice"]) == fastest
    assert min(t[0] for t in joint._all_trials) == 0.9e6


def test_the_kept_plan_is_checked_and_lowered_when_a_later_peak_is_over():
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8, outside=0)
    joint = ctx.joint_budget
    profile(model, x, ctx)
    while not joint._settled:
        seeded_step(model, x, ctx)
    kept_budget = joint._units_budget
    probe.over = 2 * UNIT  # a later step is over
    seeded_step(model, x, ctx)
    probe.over = 0
    assert joint._units_budget < kept_budget
    assert not joint._settled and joint.measuring  # warming up again


@pytest.mark.parametrize("granularity", [UNIT, 1000])
def test_a_later_peak_within_the_probes_granularity_still_fits(granularity):
    # The caching allocator's peak moves in 2 MiB blocks (MemoryProbe's
    # granularity): a peak that far over the budget fits it, but never more
    # than 2% over (SPEC §7.8; here 2% of the budget is under UNIT).
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8, outside=0)
    probe.granularity = granularity
    joint = ctx.joint_budget
    profile(model, x, ctx)
    while not joint._settled:
        seeded_step(model, x, ctx)
    tolerance = min(granularity, int(0.02 * joint.budget_bytes))
    assert tolerance == (int(0.02 * joint.budget_bytes) if granularity == UNIT else 1000)
    kept_budget = joint._units_budget
    spare = joint.budget_bytes - joint.plan["peak_bytes"]
    probe.over = spare + tolerance  # the budget and the tolerance: kept
    seeded_step(model, x, ctx)
    assert joint._settled and joint._units_budget == kept_budget
    probe.over = spare + tolerance + 1  # beyond: lowered
    seeded_step(model, x, ctx)
    probe.over = 0
    assert joint._units_budget < kept_budget and not joint._settled


def test_the_warm_up_ending_mid_race_keeps_the_best_plan_measured(monkeypatch):
    # Every candidate runs (the CPU's steps follow no model of the plan).
    monkeypatch.setattr(budget, "PRUNE", 1e9)
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, probe = make(model, 0.8, outside=0)
    joint = ctx.joint_budget
    profile(model, x, ctx)
    while len(joint._all_trials) < 2:
        seeded_step(model, x, ctx)
    # The warm-up ends (its iterations spent) while a candidate is running.
    joint.iteration = budget.WARMUP_ITERATIONS + 1
    seeded_step(model, x, ctx)
    fits = [t for t in joint._all_trials if t[1] <= joint.budget_bytes]
    assert joint._settled and fits
    assert joint.plan["choice"] == kept_trial(joint._all_trials, joint.budget_bytes)[2]["choice"]


def test_the_schedule_moves_units_where_the_plans_model_does():
    # Five 100-byte units and a 100-byte head, budget 400: the model releases
    # unit 0 for unit 4 and unit 1 for the head; in the backward, units 2..4
    # and the head hold 400, 300, 200 bytes as the head, unit 4 and unit 3
    # run, so unit 1 comes back beside unit 4's backward and unit 0 beside
    # unit 3's.
    units = [{"saved_bytes": 100, "forward_ns": 100.0, "backward_ns": 200.0,
              "recomputable": False, "input_bytes": 0, "recompute_ns": 0.0,
              "recompute_bytes": 0} for _ in range(5)]
    units[-1]["offloadable"] = False
    units.append({"saved_bytes": 100, "forward_ns": 100.0, "backward_ns": 0.0,
                  "recomputable": False, "offloadable": False})
    plan = actoffload._common.ext().plan_joint(units, 1.0, 1.0, 400, True, False)
    assert plan["choice"][:2] == ["offload", "offload"]
    assert plan["released_during"][:2] == [4, 5]
    assert plan["reloaded_during"][:2] == [3, 4]
    # The engine's steps: unit 0 released as unit 4 begins, unit 1 as well
    # (the head has no step of its own); reloads as the backward of unit 4
    # (the first) and unit 3 (the second) begin.
    assert budget.schedule_for(plan, [0, 1, 2, 3, 4]) == {0: (True, 5, False, 2),
                                                          1: (True, 5, False, 1)}
    # Glue (the plan's unit 1, between units 0 and 1) has no step either: a
    # release during it comes as unit 1 begins, a reload during it as unit
    # 0's backward begins.
    glued = {"choice": ["offload", "keep", "offload", "keep", "keep", "keep"],
             "released_during": [1, -1, 5, -1, -1, -1],
             "reloaded_during": [1, -1, 5, -1, -1, -1]}
    assert budget.schedule_for(glued, [0, 2, 3, 4]) == {0: (True, 2, False, 4),
                                                        1: (True, 4, False, 1)}


def test_units_of_one_structure_share_their_median_times():
    # By hand: three layers of one kind and one block of another; unit 0's
    # backward (its stretch holds the embeddings' too) keeps its own.
    fwd = [3.0, 1.0, 2.0, 9.0]
    bwd = [7.0, 4.0, 6.0, 8.0]
    budget_profile.share_times(fwd, bwd, ["layer", "layer", "layer", "block"])
    assert fwd == [2.0, 2.0, 2.0, 9.0]
    assert bwd == [7.0, 6.0, 6.0, 8.0]
    # In the profile: the decoder's identical layers (CPU clock, so each
    # timed differently) are planned with one forward and one backward time.
    model = Decoder()
    assert len({budget_profile.unit_kind(layer) for layer in model.layers}) == 1
    model.layers[0].requires_grad_(False)  # frozen: its backward is other work
    assert len({budget_profile.unit_kind(layer) for layer in model.layers}) == 2
    model.layers[0].requires_grad_(True)
    ctx, _ = make(model, 0.6)
    profile(model, torch.randn(2, 32, 64), ctx)
    joint = ctx.joint_budget
    units = [joint.profile["units"][i] for i in joint._index]
    assert len({u["forward_ns"] for u in units}) == 1, units
    assert len({u["backward_ns"] for u in units[1:]}) == 1, units
    assert len({u["recompute_ns"] for u in units}) == 1, units


def test_the_profile_counts_what_each_unit_holds_once_the_next_begins():
    # By hand (budget_testing.KEPT_RECORD, the first record): each unit's
    # forward leaves 100, but the code after unit 1 frees 20 of it before
    # unit 2 begins: unit 1 holds 80 from then on, and its re-run, what it
    # left at its end.
    clock = Clock(False)
    kept = KEPT_RECORD
    # Selective (second record): each keeps 40; its stretches' peaks hold
    # the cheap ops' outputs in the forward, the re-run's temporaries in the
    # backward.
    selective = {"base": 0, "before": [10, 50, 90], "after": [50, 90, 130],
                 "input": [5, 5, 5], "fwd": [0, 110, 220], "fwd_end": [100, 210, 320],
                 "bwd": [940, 720, 500], "end": 1200, "forward_peak": [80, 120, 170],
                 "backward_peak": [200, 230, 260], "head_peak": 170,
                 "bwd_allocated": [0, 0, 130], "peak": 260}
    # Recomputed in full (third record): each leaves 5 (its output, the
    # next one's input), but its forward holds its intermediates while it
    # runs: unit 1's peak is 200.
    recomputed = {"base": 0, "before": [10, 15, 20], "after": [15, 20, 25],
                  "input": [5, 5, 5], "fwd": [0, 100, 200], "fwd_end": [90, 190, 290],
                  "bwd": [900, 700, 500], "end": 1100, "forward_peak": [75, 200, 85],
                  "backward_peak": [0, 0, 0], "head_peak": 65,
                  "bwd_allocated": [0, 0, 25], "peak": 200}
    profiled, index = budget_profile.make_profile(kept, selective, clock, [True] * 3,
                                                  recompute_record=recomputed)
    units = [profiled["units"][i] for i in index]
    assert profiled["outside"] == 10
    assert [u["saved_bytes"] for u in units] == [100, 80, 100]
    assert [u["recompute_bytes"] for u in units] == [100, 100, 100]
    assert [u["forward_transient_bytes"] for u in units] == [20, 40, 20]
    assert [u["backward_transient_bytes"] for u in units] == [40, 50, 40]
    assert [u["selective_bytes"] for u in units] == [40, 40, 40]
    # 80 - 10 - 40, 120 - 10 - 80, 170 - 10 - 120; and above the re-run's
    # re-created bytes (saved less kept): 200 - 10 - 40 - 60, ...
    assert [u["selective_forward_transient_bytes"] for u in units] == [30, 30, 40]
    assert [u["selective_backward_transient_bytes"] for u in units] == [90, 100, 70]
    # 75 - 10 - 5, 200 - 10 - 10, 85 - 10 - 15.
    assert [u["recompute_forward_transient_bytes"] for u in units] == [60, 180, 60]
    # The model then predicts each profile iteration's own peak.
    def predicted(choice):
        plan = _common.ext().evaluate_joint(profiled["units"], 1.0, 1.0, 1 << 40,
                                            choice + ["keep"], False)
        return plan["peak_bytes"] + profiled["outside"]
    assert predicted(["keep"] * 3) == kept["peak"]
    assert predicted(["selective"] * 3) == selective["peak"]
    # Unit 1's forward: 10 beside, 5 + 5 inputs, 180 (its backward's peak,
    # 10 + 5 + 5 + 100 re-created + 50, is lower).
    assert predicted(["recompute"] * 3) == recomputed["peak"]


def _timed_record(bwd, end, n=4):
    """A profile record of n units by host clock (ns): forwards of 100 one
    after the other, each holding 100 bytes; `bwd[i]` when unit i's
    gradient arrived, `end` when the backward pass ended."""
    return {"base": 0, "before": [10 + 100 * i for i in range(n)],
            "after": [110 + 100 * i for i in range(n)], "input": [5] * n,
            "fwd": [100 * i for i in range(n)],
            "fwd_end": [100 * i + 100 for i in range(n)],
            "bwd": bwd, "end": end, "forward_peak": [120 + 100 * i for i in range(n)],
            "backward_peak": [420] * n, "head_peak": 420,
            "bwd_allocated": [0, 0, 0, 400], "peak": 420}


def test_the_first_units_backward_is_its_forward_times_its_kinds_ratio():
    # Unit 0's backward stretch holds the embeddings' backward too, so its
    # backward is priced from its kind: attention units (0 and 2) whose
    # backward takes 1 forward, MLP units (1 and 3) 3 forwards. One ratio
    # over all units (3, the median of 3, 1, 3) priced it at 300.
    kept = _timed_record([1500, 1200, 1100, 800], 1700)
    profiled, index = budget_profile.make_profile(
        kept, None, Clock(False), [False] * 4, kinds=["attention", "mlp"] * 2)
    units = [profiled["units"][p] for p in index]
    assert [u["backward_ns"] for u in units] == pytest.approx([100.0, 300.0, 100.0, 300.0])


def test_a_re_run_costs_what_the_recompute_iteration_measured():
    # By hand, host clock (ns). Four units of one kind, each forward 100.
    # Kept, each backward's stretch (from its gradient to the previous
    # unit's) takes 200; recomputed in full, units 1..3 take 330, 360 and
    # 320: re-runs of 1.3, 1.6 and 1.2 forwards, so each unit's re-run is
    # priced at the median of its kind, 1.3 forwards, not at its forward's
    # 100.
    clock = Clock(False)
    n = 4
    record = _timed_record
    kept = record([1400, 1200, 1000, 800], 1500)
    recomputed = record([2500, 2170, 1810, 1490], 2600)
    def rerun(compiled=None, recompute_record=recomputed):
        profiled, index = budget_profile.make_profile(
            kept, None, clock, [False] * n, kinds=["layer"] * n,
            recompute_record=recompute_record, compiled=compiled)
        return [profiled["units"][p]["recompute_ns"] for p in index]
    assert rerun() == pytest.approx([130.0] * n)
    # Without the recompute iteration (recompute not allowed): the forward's.
    assert rerun(recompute_record=None) == [100.0] * n
    # A compiled unit's recompute iteration timed its checkpointed variant's
    # compilation: it keeps its forward's time, and the others' median
    # leaves it out (unit 3's 1.2 gone: the upper median of 1.3 and 1.6).
    assert rerun(compiled=[False, False, False, True]) == pytest.approx([160.0] * 3 + [100.0])
    assert rerun(compiled=[True] * n) == [100.0] * n
    # The checkpoint's own work in the forward counts too: forwards of 110
    # under checkpoint add a tenth of a forward to each re-run.
    slower = record([2500, 2170, 1810, 1490], 2600)
    slower["fwd_end"] = [100 * i + 110 for i in range(n)]
    assert rerun(recompute_record=slower) == pytest.approx([140.0] * n)
    # A batch of another length in the recompute iteration (input bytes
    # differ) runs for another time: nothing to compare, the forward's.
    longer = record([2500, 2170, 1810, 1490], 2600)
    longer["input"] = [8] * n
    assert rerun(recompute_record=longer) == [100.0] * n
    # A stretch that measured less than the kept one (noise) does not make
    # re-runs free: half a forward at least.
    fast = record([1500, 1400, 1300, 1200], 1600)
    assert rerun(recompute_record=fast) == pytest.approx([50.0] * n)
    # Units of two kinds (attention and MLP blocks) each take their own
    # kind's median: 1.6 for units 0 and 2 (unit 0's backward stretch holds
    # the embeddings': not compared), 1.3 of 1.2 and 1.3 for 1 and 3. So
    # does a selective re-run, timed the same way in its iteration.
    blocks = ["attention", "mlp"] * 2
    profiled, index = budget_profile.make_profile(
        kept, recomputed, clock, [True] * n, kinds=blocks, recompute_record=recomputed)
    units = [profiled["units"][p] for p in index]
    assert [u["recompute_ns"] for u in units] == pytest.approx([160.0, 130.0] * 2)
    assert [u["selective_ns"] for u in units] == pytest.approx([160.0, 130.0] * 2)


class _Watched:
    """The engine's loop, each attribute read recorded."""

    def __init__(self, loop, reads):
        self._loop, self._reads = loop, reads

    def __getattr__(self, name):
        self._reads.append(name)
        return getattr(self._loop, name)


@pytest.mark.parametrize("lean", [True, False])
def test_a_settled_plan_that_offloads_nothing_runs_without_the_engine(monkeypatch, lean):
    monkeypatch.setattr(budget, "LEAN", lean)
    model = Decoder()
    x = torch.randn(2, 32, 64)
    reference = seeded_step(model, x)
    ctx, _ = make(model, 0.6, allow_offload=False)
    while ctx.joint_budget.measuring:
        assert_identical(reference, seeded_step(model, x, ctx))
    assert "recompute" in ctx.joint_budget.plan["choice"]
    reads = []
    ctx.offloader = _Watched(ctx.offloader, reads)
    for _ in range(2):
        assert_identical(reference, seeded_step(model, x, ctx))
    # Only the check for a previous forward's pass left open (its backward
    # never ran), which the engine ends.
    assert (set(reads) <= {"pass_open"}) == lean, reads
    # A plan that offloads runs through the engine, settled or not.
    model = Decoder()
    ctx, _ = make(model, 0.7, allow_recompute=False)
    while ctx.joint_budget.measuring:
        seeded_step(model, x, ctx)
    assert "offload" in ctx.joint_budget.plan["choice"]
    reads = []
    ctx.offloader = _Watched(ctx.offloader, reads)
    seeded_step(model, x, ctx)
    assert "forward_step" in reads


def test_budget_fraction_needs_a_probe_and_a_valid_fraction():
    model = Decoder()
    with pytest.raises(ValueError, match="probe"):
        actoffload.OffloadActivations(model, budget_fraction=0.5, backend="sim")
    with pytest.raises(ValueError, match="budget_fraction"):
        actoffload.OffloadActivations(model, budget_fraction=1.5, backend="sim")


def test_a_slower_measured_step_fits_the_copy_bandwidth_and_plans_again():
    # The first plan that offloads measures what the model predicts with a
    # quarter of the bandwidth: the bandwidth is fitted so that the model
    # predicts what was measured, and the joint plan is made again with it.
    model = Decoder()
    x = torch.randn(2, 32, 64)
    ctx, _ = make(model, 0.6)
    profile(model, x, ctx)
    joint = ctx.joint_budget
    units = joint.profile["units"]
    offloading = _common.ext().plan_joint(units, *joint.bandwidths, joint._units_budget,
                                          True, False)
    assert offloading["offloaded_bytes"] > 0
    before = joint.bandwidths
    recompute = [c == "recompute" for c in offloading["choice"]]
    slow = _common.ext().evaluate_joint(units, before[0] / 4, before[1] / 4,
                                        joint._units_budget, recompute, True)
    assert slow["step_ns"] > offloading["step_ns"]
    measured = slow["step_ns"]  # no trial without copies yet: nothing outside
    joint._calibrate(measured, offloading)
    assert joint._calibrated
    assert joint.bandwidths[0] < before[0] and joint.bandwidths[1] < before[1]
    again = _common.ext().evaluate_joint(units, *joint.bandwidths, joint._units_budget,
                                         recompute, True)
    assert abs(again["step_ns"] - measured) <= 0.01 * measured
    assert joint.predicted_step(offloading) == again["step_ns"]  # what the bench prints
    # A step no slower than predicted changes nothing.
    joint._calibrated, after = False, joint.bandwidths
    joint._calibrate(0.0, offloading)
    assert joint.bandwidths == after


def _selective_stack(n, kept=60, selective_ns=10.0):
    """engine/plan/joint_problem_testing.h's SelectiveStack: units of 300 bytes,
    forward 100 ns, backward 200 ns; a full re-run keeps 30 bytes and takes
    100 ns, a selective one keeps `kept` and re-runs in `selective_ns`."""
    return [dict(saved_bytes=300, forward_ns=100, backward_ns=200,
                 recomputable=True, input_bytes=30, recompute_ns=100,
                 recompute_bytes=270, selective=True, selective_bytes=kept,
                 selective_ns=selective_ns) for _ in range(n)]


def test_the_planner_chooses_selective_recompute_and_evaluates_choice_names():
    # Copies at 0.1 B/ns are too slow: re-running units 0 and 1 selectively
    # (60 bytes kept, 10 ns) beats recomputing them (100 ns): 900 + 20.
    ext = _common.ext()
    units = _selective_stack(3)
    plan = ext.plan_joint(units, 0.1, 0.1, 600, True, True)
    assert plan["choice"] == ["selective", "selective", "keep"]
    assert plan["step_ns"] == 920 and plan["selective_ns"] == 20
    assert plan["recompute_ns"] == 0 and plan["peak_bytes"] == 420
    assert "selective_ms" in plan["text"]
    # Choice names (keep and offload follow from the budget) or bools.
    same = ext.evaluate_joint(units, 0.1, 0.1, 600,
                              ["selective", "selective", "offload"], True)
    assert same["choice"] == plan["choice"] and same["step_ns"] == 920
    full = ext.evaluate_joint(units, 0.1, 0.1, 600, [True, True, False], True)
    assert full["choice"] == ["recompute", "recompute", "keep"]
    assert full["step_ns"] == 1100 and full["selective_ns"] == 0
    # Not selective (the keys absent, as for existing callers), or
    # recompute not allowed: never chosen.
    plain = [{k: v for k, v in u.items() if not k.startswith("selective")}
             for u in units]
    assert ext.plan_joint(plain, 0.1, 0.1, 600, True, True)["choice"] == [
        "recompute", "recompute", "keep"]
    assert "selective" not in ext.plan_joint(units, 0.1, 0.1, 600, True, False)["choice"]
    with pytest.raises(Exception, match="unit 0: selective but not selective"):
        ext.evaluate_joint(plain, 0.1, 0.1, 600, ["selective", "keep", "keep"], True)
    with pytest.raises(ValueError, match="unknown unit choice 'fast'"):
        ext.evaluate_joint(units, 0.1, 0.1, 600, ["fast", "keep", "keep"], True)
    bad = _selective_stack(2, kept=0)
    with pytest.raises(Exception, match="unit 0: selective_bytes 0"):
        ext.plan_joint(bad, 0.1, 0.1, 600, True, True)
    # The limit is never above the plan; the race calibrates a selective plan.
    assert ext.joint_limit(units, 0.1, 0.1, 600)["step_ns"] <= plan["step_ns"]
    race = ext.JointRace(_selective_stack(4), 3.0, 3.0, 700, 0, True, True,
                         [0, 1, 2, 3], margin=0.0)
    race.start()
    slow = ext.evaluate_joint(_selective_stack(4), 0.75, 0.75, race.units_budget,
                              ["keep", "selective", "keep", "keep"], True)
    assert slow["choice"] == ["offload", "selective", "keep", "keep"]
    race.calibrate(slow["step_ns"], slow["choice"])
    assert race.bandwidths[0] == pytest.approx(0.75, rel=0.02)
