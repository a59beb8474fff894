"""The budget's profile where the device cannot hold a plain step (budget.py).

The profile's first iteration keeps every unit, to measure what each
saves; its second runs every unit selectively. A model whose plain step
does not fit the device ran out of memory there, and could not be planned
at all, though checkpointing would have held it. So, where the probe can
say how much more the allocator can hand out (MemoryProbe.room), those
iterations run windows: from the first unit not yet measured, units run
as the iteration's kind ("keep", "selective") while what the forward holds
and the most a unit's forward was seen to add stay within SHARE of that
room; the units after the window, and those measured before, are
recomputed in full (what costs least to hold). The next iteration's window
begins where this one's ended, one unit early: what the code after a unit
frees counts in its figures (the layer's input, which the model's loop
drops once the layer has run), and a unit recomputed in full may leave its
caller holding what a plain step saves and the caller then frees there
(Hugging Face's eager attention returns its weights; the layer drops them
after its MLP). So a window's first new unit runs after one run as a plain
step runs it, and is measured there (stitch takes a unit's figures from
the first window that ran it as the kind). Where such a window runs out of
memory, later ones begin where the last ended (Windows.shrink). This goes
on until every unit has run the kind once;
budget_profile.stitch then makes one record of them, as if one step had
run them all so. A model whose forward holds less than SHARE of the room
runs one window of every unit: the profile it always had."""

# The share of the room (what the allocator could still hand out as the
# forward began) that a window's forward may hold: the rest is for the
# units recomputed after it, the head (logits and loss), the backward's
# gradients and the allocator's blocks left partly used. At 0.6, a window
# of eager-attention layers (whose backwards hold more than their forwards
# save) peaked within 0.85 of the room and, with 55 MiB reserved but
# unused, found no 32 MiB (run 125).
SHARE = 0.5
# A window whose step peaked above this share of the room makes the next
# ones smaller in proportion (down to one unit each).
FULL = 0.8


class Windows:
    """The window iterations of the profile kind being measured."""

    def __init__(self):
        self.records = []  # this kind's iterations, each with its "ran"
        self.share = SHARE
        self.early = True  # whether a window begins one unit early
        self._grown = 0    # the most a unit's forward added, as measured

    def begin(self, r, kind, choices, room):
        """A profile iteration of `kind` ("keep", "selective" or
        "recompute": how it runs the units it measures) begins with record
        `r`, unit i running as choices[i] (choices()); `room`: what the
        allocator can still hand out, or None (no windows)."""
        r["kind"] = kind
        r["ran"] = list(choices)
        r["room"] = room
        done = self.measured(kind)
        # the units this window measures first (not the one it begins early with)
        r["new"] = [how == kind and not (i < len(done) and done[i])
                    for i, how in enumerate(choices)]
        r["window"] = False  # whether a new unit ran the kind here (None: the window ended)

    def unit_ended(self, r, index, recomputable):
        """Unit `index`'s forward ended in record `r`: the units after it
        that are to be recomputed from now on (recomputable(i) says which
        may be), where the window ends here; else []. The most a unit run
        as the record's kind added (its stretch's peak above its start) is
        what the next one is taken to add; the window ends where what the
        forward holds and that would pass SHARE of the room, once it has
        run a unit not measured before."""
        if r["window"] is None:
            return []
        if r["ran"][index] == r["kind"] and r["kind"] != "recompute":
            added = r["forward_peak"][index] - (r["before"][index] - r["base"])
            self._grown = max(self._grown, added)
            r["window"] = r["window"] or r["new"][index]
        if not r["window"] or r["room"] is None:
            return []
        held = r["after"][index] - r["base"]
        if held + self._grown <= self.share * r["room"]:
            return []
        r["window"] = None  # ended (once)
        later = [i for i in range(index + 1, len(r["ran"]))
                 if recomputable(i) and r["ran"][i] != "recompute"]
        for i in later:
            r["ran"][i] = "recompute"
        return later

    def ended(self, r, eligible):
        """Record `r`'s pass ended: True once every eligible unit (eligible[i])
        ran as its kind in one of the kind's iterations (take() then gives
        them, for budget_profile.stitch)."""
        self.records.append(r)
        if r["kind"] != "recompute" and r["room"] and r["peak"] > FULL * r["room"]:
            self.share *= FULL * r["room"] / r["peak"]
        kind = r["kind"]
        return all(not eligible[i] or any(w["ran"][i] == kind for w in self.records)
                   for i in range(len(eligible)))

    def measured(self, kind):
        """Per unit, whether an earlier window of `kind` ran it so."""
        n = len(self.records[0]["ran"]) if self.records else 0
        return [any(w["ran"][i] == kind for w in self.records) for i in range(n)]

    def take(self):
        """This kind's records and how each ran its units; the next kind
        begins with none."""
        records, self.records = self.records, []
        return records, [r["ran"] for r in records]

    def shrink(self, r):
        """Record `r`'s window ran out of device memory: the next holds half
        as much, and where `r` was the least a window can be, one unit
        early and one new one, none begins early from now on (such a window
        would fail at every step). Larger ones still begin early: without
        it, a unit after a recomputed one can be measured with what that
        one returned (GPU run 133: a block stitched at 25 MB of its 51)."""
        self.share /= 2
        kind = [how == r["kind"] for how in r["ran"]]
        early = sum(k and not new for k, new in zip(kind, r["new"]))
        if early and sum(k and new for k, new in zip(kind, r["new"])) <= 1:
            self.early = False


def eligible(kind, selective_allowed):
    """Per unit, whether a profile iteration of `kind` ("all", "selective",
    "recompute") measures it: every unit kept; those allowed
    (selective_allowed[i]) selectively; "recompute" runs no windows."""
    if kind == "all":
        return [True] * len(selective_allowed)
    if kind == "selective":
        return list(selective_allowed)
    return [False] * len(selective_allowed)


def choices(kind, measures, recomputable, measured, early=True):
    """(how the record names its kind, how each unit runs as the forward
    begins) in a profile iteration of `kind`; measures[i]:
    eligible(kind)[i]; recomputable[i]: whether unit i may be re-run;
    measured[i] (or shorter: False): whether an earlier window ran it as
    the kind (it is recomputed now, where it may be, but, where `early`
    (Windows.early), for the one right before a unit not measured yet: the
    window begins with it)."""
    if kind == "recompute":
        return "recompute", ["recompute" if r else "keep" for r in recomputable]
    ran = "keep" if kind == "all" else "selective"
    done = list(measured) + [False] * (len(recomputable) - len(measured))
    how = ["recompute" if d and r else ran if m else "keep"
           for m, r, d in zip(measures, recomputable, done)]
    for i in range(1, len(how) if early else 0):
        if how[i - 1] == "recompute" and measures[i] and not done[i]:
            how[i - 1] = ran
    return ran, how
