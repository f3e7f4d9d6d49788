"""Racing (SMAC3's intensification): which trials earn more seeds before they are told.

A trial whose seeds all survived and that could become the best is not told yet: it runs on the
next race level's seeds (2 -> 4 -> 8, ``Budget.race_levels``), shared by every raced trial. It
could become the best when its validation loss is below that of every trial that survived as many
seeds, and below that of every trial that survived more seeds by more than the seeds' noise
(``RACE_Z`` standard errors of the difference, from that trial's spread over its seeds): a
challenger within the noise of a raced incumbent is not worth its race runs. One diverging race
seed makes it diverged (the loop tells TPE); a trial that falls behind stops racing and is told
COMPLETE on the seeds it has. A trial behind only trials still racing waits (no runs, not told)
until their races decide whether it could lead.

:class:`Racing` holds the standings and answers the search loop with a
:class:`~tuner.driver.outcome.Decision` (RUN to a race level, WAIT, or TELL with why it was not
raced); the loop submits the runs and tells Optuna.
"""

from __future__ import annotations

import statistics

import optuna

from tuner.driver.outcome import Act, Decision
from tuner.driver.trialrecord import read
from tuner.records import TrialOutcome, TrialState

RACE_Z = 1.0  # a challenger races past a trial on more seeds only when better by this many standard errors


def standing(study: optuna.Study) -> dict[int, tuple[int, float]]:
    """Trial number -> (seeds survived, validation loss) of the study's COMPLETE trials that learned."""
    out = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        record = read(t)
        if t.value is not None and record is not None and record.learned is not False:
            out[t.number] = (len(record.seeds), float(t.value))
    return out


class Racing:
    """The race policy (module docs): ``levels`` are the seed counts a raced trial reaches after its
    ``seeds`` search seeds; ``standings`` those of the trials an earlier launch told."""

    def __init__(self, levels: tuple[int, ...], seeds: int, standings: dict[int, tuple[int, float]]) -> None:
        self.levels, self.seeds = levels, seeds
        # trial number -> (seeds survived, validation loss) of every trial that survived and learned
        self._standing = dict(standings)
        self._spread: dict[int, float] = {}  # trial number -> standard deviation of its seeds' validation losses
        self._racing: set[int] = set()  # trials whose race runs are in flight
        self._waiting: dict[int, TrialOutcome] = {}  # trials waiting for a race to decide theirs

    def values(self) -> list[float]:
        """The validation losses of the trials that survived all their seeds and learned."""
        return [value for _, value in self._standing.values()]

    def on_trial_result(self, outcome: TrialOutcome) -> Decision:
        """A trial's runs ended as ``outcome``: record it in the standings and decide what comes next."""
        number = outcome.number
        self._standing.pop(number, None)
        self._racing.discard(number)
        if outcome.state is not TrialState.SURVIVED or outcome.learned is False or outcome.value is None:
            return Decision(Act.TELL)
        self._standing[number] = (len(outcome.seeds), outcome.value)
        losses = [r.val_loss for r in outcome.seeds if r.val_loss is not None]
        self._spread[number] = statistics.stdev(losses) if len(losses) > 1 else 0.0
        return self._decide(outcome)

    def reconsider(self) -> list[tuple[TrialOutcome, Decision]]:
        """The waiting trials, best first, each decided again now that a race moved on (in order: a
        trial sent racing counts as racing for the ones after it)."""
        decided = []
        for waiting in sorted(self._waiting.values(), key=lambda o: o.value or 0.0):
            del self._waiting[waiting.number]
            decided.append((waiting, self._decide(waiting)))
        return decided

    def _decide(self, outcome: TrialOutcome) -> Decision:
        """Race the trial on, let it wait for a race that decides whether it could win, or tell it."""
        have, number = len(outcome.seeds), outcome.number
        level = next((n for n in self.levels if n > have), None)
        better = [n for n, (seeds, value) in self._standing.items()
                  if n != number and seeds >= have and outcome.value is not None
                  and value <= outcome.value + self._noise(n, seeds, have)]
        if level is not None and not better:
            self._racing.add(number)
            return Decision(Act.RUN, seeds=level)
        if level is not None and all(n in self._racing for n in better):
            self._waiting[number] = outcome  # behind trials still racing: it may lead once they fall out
            return Decision(Act.WAIT)
        if level is None:
            return Decision(Act.TELL)
        # why it was not raced on, in the record (tuner.driver.trialrecord.why_not)
        return Decision(Act.TELL, reason=self._not_raced(outcome, min(better, key=lambda n: self._standing[n][1])))

    def _not_raced(self, outcome: TrialOutcome, leader: int) -> str:
        """``0.0473 on 2 seeds is within 1 standard error of trial 4's 0.0545 on 8 seeds; not raced``, or
        ``behind trial 4's 0.0545 on 8 seeds; not raced``."""
        seeds, value = self._standing[leader]
        mine = f"{outcome.value:.4g} on {len(outcome.seeds)} seeds"
        theirs = f"trial {leader}'s {value:.4g} on {seeds} seeds"
        further = " further" if len(outcome.seeds) > self.seeds else ""
        if outcome.value is not None and value > outcome.value:
            return f"{mine} is within {RACE_Z:g} standard error of {theirs}; not raced{further}"
        return f"behind {theirs}; not raced{further}"

    def _noise(self, incumbent: int, seeds: int, have: int) -> float:
        """How far a trial on ``have`` seeds must beat ``incumbent`` (on ``seeds``) to race past it:
        ``RACE_Z`` standard errors of the difference of the two means, with the incumbent's spread
        over its seeds standing for both (0 against a trial on as many seeds, or of an earlier launch)."""
        if seeds <= have:
            return 0.0
        return RACE_Z * self._spread.get(incumbent, 0.0) * (1.0 / have + 1.0 / seeds) ** 0.5
