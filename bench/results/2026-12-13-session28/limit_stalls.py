"""Session 28 (CPU only): where does the joint plan's model lose time against
the limit? For each profile of a bench dump (profiles-*.json), the limit's
own choice is evaluated by the planner's model (_C.evaluate_joint) as it is,
with the copies to host made 100 times faster, and with the copies back
made 100 times faster. Whichever brings the model's step down to the
limit's says which copies the model waits for: its whole-unit release (to
host) or its whole-unit reload (back). The limit's copies are fluid (any
byte may move as soon as it exists, and must be back only as it is read).

    cd python && PYTHONPATH=$PWD /usr/bin/python3 \
        ../bench/results/2026-12-13-session28/limit_stalls.py DUMP...

Columns: dump, budget fraction, system, the limit's choice and step (ms),
the planner's plan and its predicted step, then the limit's choice in the
model: as measured, to host x100, back x100. The exact limit takes at most
14 units, so block dumps are skipped.
"""
import json
import os
import sys

from actoffload import _common

LETTER = {"keep": "K", "offload": "O", "recompute": "R", "selective": "S",
          "selective-offload": "Q"}


def letters(choice):
    return "".join(LETTER[c] for c in choice)


def ms(ns):
    return f"{ns / 1e6:.2f}"


def main(paths):
    ext = _common.ext()
    for path in paths:
        for prof in json.load(open(path)):
            units, budget = prof["units"], prof["units_budget"]
            d2h, h2d = prof["bandwidths"]
            head = [os.path.basename(path), str(prof.get("fraction")), prof.get("system")]
            if len(units) > 14:
                print(*head, "skipped: more than 14 units")
                continue
            limit = ext.joint_limit(units, d2h, h2d, budget, True, True)
            plan = ext.plan_joint(units, d2h, h2d, budget)
            if limit is None or plan is None:
                print(*head, "no plan fits")
                continue
            row = head + ["limit", letters(limit["choice"]), ms(limit["step_ns"]),
                          "plan", letters(plan["choice"]), ms(plan["step_ns"])]
            for name, (to_host, back) in (("as measured", (d2h, h2d)),
                                          ("to host x100", (100 * d2h, h2d)),
                                          ("back x100", (d2h, 100 * h2d))):
                got = ext.evaluate_joint(units, to_host, back, budget,
                                         list(limit["choice"]), True)
                row += [name, "-" if got is None else ms(got["step_ns"])]
            print(*row)


if __name__ == "__main__":
    main(sys.argv[1:])
