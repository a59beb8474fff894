"""The budget's profile (budget.py): from the profile iterations' records,
the units the engine's joint planner takes (engine/plan/joint_plan.h;
engine/unit_cost.h: UnitCost's fields by name) and each caller unit's place among them."""


def make_profile(r, selective_record, clock, selective, kinds=None,
                 recompute_record=None, compiled=None, recomputable=None):
    """(profile, index): `r` is the first profile iteration's record (nothing
    offloaded or recomputed; or one stitched from its windows, stitch),
    `selective_record` the second's (the units
    with selective[i] recomputed selectively) or None, `recompute_record`
    the last's (every unit that may be recomputed in full) or None;
    selective[i] says whether unit i may be recomputed selectively too;
    kinds[i] (optional)
    names unit i's structure (unit_kind): units of one kind share their
    median times; compiled[i] (optional) says unit i was compiled: its
    re-run runs the very compiled graph its forward ran, so it takes its
    forward's time (the recompute iteration may have timed a compilation:
    its first call under a checkpoint); recomputable[i] (optional, else True) whether unit i may
    be re-run at all. profile["units"] are the plan's units (glue and the head
    among them), index[i] unit i's place there."""
    r, selective_record, recompute_record = (
        None if record is None else timed(record, clock)
        for record in (r, selective_record, recompute_record))
    n = len(r["fwd_ns"])
    fwd = list(r["fwd_ns"])
    bwd = list(r["bwd_ns"])
    if kinds is not None:
        share_times(fwd, bwd, kinds)
    kinds = kinds or [None] * n
    # A backward not timed alone (unit 0's stretch holds the embeddings'
    # backward too) is its forward times its kind's backward per forward:
    # one median over an eager Llama's blocks gave attention's the MLP's
    # 2.9 (12.2 ms where the others took 5.1; run 51).
    ratio = _median_per_kind([bwd[i] / fwd[i] if i > 0 and bwd[i] is not None and fwd[i] > 0
                              else None for i in range(n)], kinds)
    sel_ratio = ([None] * n if selective_record is None
                 else _median_per_kind(_selective_gains(selective_record, r, fwd, bwd),
                                       kinds))
    recomputable = recomputable or [True] * n
    rerun = ([None] * n if recompute_record is None
             else _median_per_kind(_rerun_ratios(recompute_record, r, fwd, bwd,
                                                 [(compiled and compiled[i]) or not recomputable[i]
                                                  for i in range(n)]), kinds))
    # Bytes above the forward's start. What stays beside the units
    # throughout: what ran before them (embeddings) or, as their
    # backward begins, the head's gradients. What the code between two
    # units leaves (norms, residual adds around blocks) is glue: one
    # more unit there, never offloaded or recomputed. Each unit's
    # transients are its stretch's peak above that and the bytes saved
    # so far (unit i's forward and backward both see everything up to
    # its own); the head's (logits, loss and their backward) is one more
    # unit, last, never offloaded or recomputed. A unit's saved bytes are
    # what it leaves once the next unit begins: the code between them
    # may free what the unit's end still held (a Hugging Face layer's
    # input, which the layer does not save itself, goes when the model's
    # loop moves on: 64 MiB a layer on the Llama). Counted at the
    # unit's end, each unit seemed to hold that much more, and a plan
    # recomputing units was that much per unit over its prediction. A
    # re-run holds what the forward left at its end (recompute_bytes).
    left, saved, glue = _held(r)
    least_glue = sum(saved) // (100 * n)  # smaller glue is left out
    so_far = _so_far(saved, glue, least_glue)
    before = max(r["before"][0] - r["base"], 0)
    at_backward = r["bwd_allocated"][n - 1]
    at_backward = 0 if at_backward is None else max(at_backward - so_far[-1], 0)
    outside = max(before, at_backward)
    units, index = [], []
    for i in range(n):
        if glue[i] > least_glue:
            units.append({"saved_bytes": glue[i], "forward_ns": 0.0, "backward_ns": 0.0,
                          "recomputable": False, "offloadable": False})
        index.append(len(units))
        units.append({
            "saved_bytes": saved[i], "forward_ns": fwd[i],
            "backward_ns": (bwd[i] if bwd[i] is not None and i > 0
                            else fwd[i] * (2.0 if ratio[i] is None else ratio[i])),
            "recomputable": recomputable[i],
            "input_bytes": min(r["input"][i], saved[i]),
            "recompute_ns": (fwd[i] if rerun[i] is None or (compiled and compiled[i])
                             else rerun[i] * fwd[i]),
            "recompute_bytes": left[i],
            "forward_transient_bytes": max(r["forward_peak"][i] - outside - so_far[i], 0),
            "backward_transient_bytes": max(r["backward_peak"][i] - outside - so_far[i], 0)})
        if selective_record is not None and selective[i]:
            units[-1].update(_selective_cost(selective_record, i, units[-1], sel_ratio[i]))
    if selective_record is not None:
        _selective_transients(selective_record, [units[p] for p in index],
                              outside, least_glue)
    if recompute_record is not None:
        _recompute_transients(recompute_record, [units[p] for p in index],
                              outside, least_glue)
    # The engine's steps are the units' beginnings: the last unit cannot
    # be released before its own backward (the head runs in between).
    units[-1]["offloadable"] = False
    head_bytes = max(r["head_peak"] - outside - so_far[-1], 1)
    head_ns = r["head_ns"] or 0.0
    units.append({"saved_bytes": head_bytes, "forward_ns": head_ns,
                  "backward_ns": 0.0, "recomputable": False,
                  "offloadable": False})
    return {"units": units, "peak": r["peak"], "outside": outside,
            "head": head_bytes}, index


def timed(r, clock):
    """`r` with its stretches' times in ns from its marks (`clock`):
    fwd_ns[i] (unit i's forward), bwd_ns[i] (from its gradient to the
    previous unit's, or to the pass's end for unit 0), head_ns (from the
    last unit's end to the units' backward); None where a mark is missing.
    A stitched record (stitch) has them already."""
    if "fwd_ns" in r:
        return r
    n = len(r["fwd"])

    def ns(start, end):
        return None if start is None or end is None else clock.ns(start, end)
    return dict(r, fwd_ns=[ns(r["fwd"][i], r["fwd_end"][i]) for i in range(n)],
                bwd_ns=[ns(r["bwd"][i], r["bwd"][i - 1] if i > 0 else r["end"])
                        for i in range(n)],
                head_ns=ns(r["fwd_end"][n - 1], r["bwd"][n - 1]))


def stitch(records, ran, kind, clock):
    """One record of profile kind `kind` ("keep" or "selective") from the
    profile window iterations that ran it (budget_windows.py): each ran
    some units as `kind` and recomputed the others, so that the step fits
    the device. ran[k][i] is how records[k] ran unit i. Unit i's figures
    come from the first record that ran it as `kind` (the first record
    where none did): its forward's and backward's times, the bytes its
    forward left, what the code after it left or freed before the next
    unit began, and its stretches' peaks and what was allocated as its
    backward began, each relative to what that record held at the unit's
    end; the head's from the record that ran the last unit. The stitched
    record holds what the units hold in one step that ran them all as
    `kind`, relative to the forward's start (its base is 0); its peak is
    its highest stretch. A single record is its own."""
    if len(records) == 1:
        return timed(records[0], clock)
    records = [timed(r, clock) for r in records]
    n = len(records[0]["before"])
    source = []
    for i in range(n):
        of_kind = [r for r, how in zip(records, ran) if how[i] == kind]
        source.append(of_kind[0] if of_kind else records[0])
    s = {"base": 0, "input": list(records[0]["input"]), "profile": True,
         "before": [0] * n, "after": [0] * n, "forward_peak": [0] * n,
         "backward_peak": [0] * n, "bwd_allocated": [None] * n,
         "fwd_ns": [r["fwd_ns"][i] for i, r in enumerate(source)],
         "bwd_ns": [r["bwd_ns"][i] for i, r in enumerate(source)],
         "head_ns": source[-1]["head_ns"], "fwd_end": [True] * n,
         "windows": [list(how) for how in ran]}
    at = source[0]["before"][0] - source[0]["base"]
    for i, r in enumerate(source):
        s["before"][i] = at
        s["after"][i] = at + r["after"][i] - r["before"][i]
        shift = s["after"][i] - (r["after"][i] - r["base"])  # held here beyond r's
        s["forward_peak"][i] = r["forward_peak"][i] + shift
        if r["bwd_allocated"][i] is not None:
            s["bwd_allocated"][i] = r["bwd_allocated"][i] + shift
            s["backward_peak"][i] = r["backward_peak"][i] + shift
        if i + 1 < n:
            at = s["after"][i] + r["before"][i + 1] - r["after"][i]
    last = source[-1]
    s["head_peak"] = last["head_peak"] + s["after"][-1] - (last["after"][-1] - last["base"])
    s["peak"] = s["top"] = max(s["forward_peak"] + s["backward_peak"] + [s["head_peak"]])
    return s


def _held(r):
    """(left, saved, glue) per unit of one record: what its forward left
    at its end, what it leaves once the next unit begins (at least 1), and
    what the code before it leaves (0 where that frees bytes instead)."""
    n = len(r["before"])
    left = [r["after"][i] - r["before"][i] for i in range(n)]
    gap = [0] + [r["before"][i] - r["after"][i - 1] for i in range(1, n)] + [0]
    saved = [max(left[i] + min(gap[i + 1], 0), 1) for i in range(n)]
    return [max(b, 0) for b in left], saved, [max(g, 0) for g in gap[:n]]


def _so_far(saved, glue, least_glue):
    """Per unit: the bytes held from the first unit's start to its end."""
    return [sum(saved[:i + 1]) + sum(g for g in glue[:i + 1] if g > least_glue)
            for i in range(len(saved))]


def _above(record, outside, least_glue):
    """Per unit of a profile iteration's `record`: its forward's and its
    backward's peaks above what stays beside the units and what is held up
    to its end in that iteration, or None where it did not run."""
    _, held, glue = _held(record)
    so_far = _so_far(held, glue, least_glue)
    return [None if record["fwd_end"][i] is None else
            (record["forward_peak"][i] - outside - so_far[i],
             record["backward_peak"][i] - outside - so_far[i])
            for i in range(len(held))]


def _selective_transients(selective, units, outside, least_glue):
    """Sets each selective unit's selective transients (engine/unit_cost.h)
    from the selective profile iteration, where it ran selectively: its
    forward's peak above what is on device with its kept bytes, and its
    backward's above that with what its re-run re-creates. (On the issue's
    Llama: 352 MiB in the forward where kept units hold 192, and 736 MiB
    in the backward where they hold 416; on eager Llama 2.3 and 3.7 GiB
    beside 0.7 and 2.4.)"""
    for u, above in zip(units, _above(selective, outside, least_glue)):
        if not u.get("selective") or above is None:
            continue
        recreated = u["saved_bytes"] - u["selective_bytes"]
        u["selective_forward_transient_bytes"] = max(above[0], 0)
        u["selective_backward_transient_bytes"] = max(above[1] - recreated, 0)


def _recompute_transients(recomputed, units, outside, least_glue):
    """Sets each unit's recompute_forward_transient_bytes (engine/unit_cost.h)
    from the profile iteration that recomputes every unit in full: its
    forward's peak above what is on device with what it leaves. (On the
    issue's Llama, H200: 592 MiB a layer, where the model had counted the
    kept forward's 192; plans with recomputed units measured up to 400 MiB
    over in the forward, 306 where selective-offload units had lowered the
    backward below it.)"""
    for u, above in zip(units, _above(recomputed, outside, least_glue)):
        if above is not None:
            u["recompute_forward_transient_bytes"] = max(above[0], 0)


def unit_kind(unit):
    """What makes two units the same work: their class and their
    parameters' names, shapes, dtypes and whether they take gradients (the
    decoder layers of one model are one kind, its attention and MLP blocks
    two; a frozen layer, whose backward computes no weight gradients, is
    another)."""
    return (type(unit).__qualname__,
            tuple((name, tuple(p.shape), p.dtype, p.requires_grad)
                  for name, p in unit.named_parameters()))


def share_times(fwd, bwd, kinds):
    """Gives the units of each kind their median forward time and (unit 0
    aside: its backward's stretch holds the embeddings' too) their median
    backward time, in place. Why: one iteration's CUDA events time
    identical GPT-2 layers at 1.75 to 2.76 ms (the caching allocator's
    first cudaMallocs, a busy machine), and the planner then re-ran the
    layers timed cheapest, not the ones whose re-run frees the most."""
    def median(values):
        return sorted(values)[len(values) // 2]

    groups = {}
    for i, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        f = median([fwd[i] for i in members])
        for i in members:
            fwd[i] = f
        timed = [i for i in members if i > 0 and bwd[i] is not None]
        if timed:
            b = median([bwd[i] for i in timed])
            for i in timed:
                bwd[i] = b


def _selective_gains(selective, kept, fwd, bwd):
    """Per unit, the time it gained run selectively per ns of its forward:
    its backward's re-run of the cheap ops, and its forward's caching of
    the costly ones' outputs (the policy sees every op); None if unknown."""
    gains = [None] * len(fwd)
    for i in range(1, len(fwd)):
        if not _comparable(selective, kept, i) or bwd[i] is None or fwd[i] <= 0:
            continue
        gains[i] = max(selective["bwd_ns"][i] - bwd[i] + selective["fwd_ns"][i] - fwd[i],
                       0.0) / fwd[i]
    return gains


def _median_per_kind(values, kinds):
    """Each unit's share of its forward from one iteration's `values` (None
    where not measured; one unit's is too noisy alone): the median over the
    measured units of its kind (unit_kind), or, where none of its kind was
    measured, over all; None if nothing was. Per kind, because one median
    over an eager Llama's attention and MLP blocks priced the attention
    blocks' selective re-runs at the MLP blocks' share (0.69 ms after a
    4.25 ms forward): all-selective blocks measured 154 ms where the model
    said 103 (H200, run 50)."""
    def median(measured):
        return sorted(measured)[len(measured) // 2] if measured else None

    overall = median([v for v in values if v is not None])
    of_kind = {}
    for v, kind in zip(values, kinds):
        if v is not None:
            of_kind.setdefault(kind, []).append(v)
    return [median(of_kind[kind]) if kind in of_kind else overall for kind in kinds]


def _comparable(record, kept, i):
    """Whether unit i ran and was timed whole in `record`, on an input of
    the size it had in the kept record (a batch of another sequence length
    runs for another time)."""
    return (record["bwd_ns"][i] is not None and record["fwd_ns"][i] is not None
            and record["input"][i] == kept["input"][i])


def _rerun_ratios(recomputed, kept, fwd, bwd, skip):
    """Per unit, a full re-run's time per ns of its forward, from the
    profile iteration that recomputes every unit: what its backward's
    stretch took there over the kept one's, and its forward under
    checkpoint over the kept forward (the checkpoint's own work, e.g.
    saving the RNG state); at least _LEAST_RERUN (a noisy stretch must not
    make re-runs look free); None if unknown. Why not the forward's time: a
    re-run is the forward's work without the engine's hooks and with the
    checkpoint's own (H200: the issue's SDPA Llama layer re-ran in 6.6-6.7
    ms after a 7.3 ms forward, and the model then predicted checkpointing's
    step within 0.1%; an eager-attention one in 4.8 ms after 4.95).
    skip[i]: unit i is left out (not re-run there, or compiled: its re-run
    there may have been a compilation)."""
    ratios = [None] * len(fwd)
    for i in range(1, len(fwd)):
        if skip[i] or not _comparable(recomputed, kept, i) or bwd[i] is None or fwd[i] <= 0:
            continue
        extra = (recomputed["bwd_ns"][i] - bwd[i]
                 + recomputed["fwd_ns"][i] - fwd[i])
        ratios[i] = max(extra / fwd[i], _LEAST_RERUN)
    return ratios


_LEAST_RERUN = 0.5


def _selective_cost(selective, i, unit, ratio):
    """Unit i's figures for the selective choice (engine/plan/joint_plan.h): the
    bytes its selective forward left allocated (at least its input's, at
    most what it saves whole) and its time, the median gain's share of its
    forward (one iteration's times are too noisy per unit); where the
    policy's own cost makes that more than a whole re-run, the planner
    recomputes whole instead."""
    if selective["fwd_end"][i] is None or ratio is None:
        return {}
    left = selective["after"][i] - selective["before"][i]
    kept = min(max(left, unit["input_bytes"], 1), unit["saved_bytes"])
    return {"selective": True, "selective_bytes": kept,
            "selective_ns": ratio * unit["forward_ns"]}
