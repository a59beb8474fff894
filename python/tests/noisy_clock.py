"""Runs pytest with every stretch the budget measures (probe.Clock.ns)
scaled by a random factor in [1 - JITTER, 1 + JITTER]: which tests depend on
how the race's trials happen to time on the host clock?

    cd python && PYTHONPATH=$PWD:$PWD/tests /usr/bin/python3 tests/noisy_clock.py SEED \
        -q -p no:cacheprovider tests/test_budget_rungs.py ...

A test that fails here and passes without it rests on host-clock noise (as
the one CI failed on at session 27's end: two plans within the noise, the
race kept either). Expected failures: tests that script the clock
themselves and check its figures, and tests that spawn processes (this
runner is not an importable main module)."""

import random
import sys

import pytest

from actoffload import probe

JITTER = 0.3


def main(argv):
    rng = random.Random(int(argv[0]))
    measured = probe.Clock.ns

    def noisy(clock, start, end):
        return measured(clock, start, end) * rng.uniform(1 - JITTER, 1 + JITTER)

    probe.Clock.ns = noisy
    return pytest.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
