"""The engine's race (engine/plan/joint_race.h) as the budget (budget.py)
reads it: before the race is made, at the profile, its figures are the
user's and the profile's; after, the race's own."""


class RaceView:
    """What JointBudget reads of its race, `_race` (a _C.JointRace, or None
    before the profile), and before it: `_budget_bytes`, `_bandwidths` and
    `profile`."""

    @property
    def budget_bytes(self):
        """The step's budget: the user's (or, with budget_fraction, set at
        the profile); the smallest that fits after a refusal."""
        return self._budget_bytes if self._race is None else self._race.budget

    @property
    def bandwidths(self):
        """The copy bandwidths (GB/s to host, back): measured, then fitted
        to the first plan that offloads."""
        return self._bandwidths if self._race is None else self._race.bandwidths

    @property
    def model_units(self):
        """The plan's units (profile["units"]) with the bytes the race
        measured re-run units to hold beyond them (JointRace::FitExcess)."""
        return self.profile["units"] if self._race is None else self._race.units

    @property
    def excess(self):
        """(bytes, bytes): what each unit recomputed in full and each
        selective one measured above the profile, as the race fitted them."""
        return (0, 0) if self._race is None else self._race.excess

    @property
    def _units_budget(self):
        return None if self._race is None else self._race.units_budget

    @property
    def candidates(self):
        """Plans still to run in warm-up."""
        return [] if self._race is None else self._race.candidates

    @property
    def trials(self):
        """(measured step ns, peak, plan) of the candidates run."""
        return [] if self._race is None else self._race.trials

    @property
    def _all_trials(self):
        """Every trial since the profile."""
        return [] if self._race is None else self._race.all_trials

    @property
    def _settled(self):
        return self._race is not None and self._race.settled

    @property
    def _calibrated(self):
        return self._race is not None and self._race.calibrated

    @_calibrated.setter
    def _calibrated(self, value):
        self._race.calibrated = value

    def _calibrate(self, step_ns, plan):
        """Fits the copy bandwidths to a measured step of `plan` (the race's
        Calibrate); where they are lowered, the joint plan made with them
        is raced first."""
        self._race.calibrate(step_ns, plan["choice"])
