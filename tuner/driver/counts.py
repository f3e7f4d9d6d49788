"""How a study's recorded trials ended, counted once for every view (the terminal, ``tuner report``,
the plots, optuna-dashboard's note, the MLflow launch run)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.driver.trialrecord import TrialRecord
from tuner.records import TrialState


@dataclass(frozen=True)
class Counts:
    """How a study's recorded trials ended: the one definition of every count tuner shows.

    ``finished`` is every trial tuner recorded (``survived + diverged + stopped + failed``; a
    duplicate config that was never trained, or a trial whose launch stopped mid-run, has no record).
    ``diverged_fraction`` (the Playbook's infeasible fraction) is ``diverged / (survived + diverged)``:
    of the trials that ran until they either survived the budget on every seed or diverged; a trial
    the pruner stopped showed neither, and a failed one is a crash, so neither is in the denominator.
    A survivor that did not learn counts as survived.
    """

    survived: int = 0
    diverged: int = 0
    stopped: int = 0
    failed: int = 0

    @classmethod
    def of(cls, records: Iterable[TrialRecord]) -> Counts:
        """The counts of ``records``.

        >>> from tuner.records import TrialState
        >>> records = [TrialRecord(n, state, {}, 600, ()) for n, state in enumerate(
        ...     [TrialState.SURVIVED, TrialState.DIVERGED, TrialState.STOPPED, TrialState.STOPPED])]
        >>> counts = Counts.of(records)
        >>> print(counts.text())
        4 trials finished: 1 survived, 1 diverged, 2 stopped by the pruner, 0 failed
        >>> print(counts.fraction_text())
        diverged fraction 50% (1 of the 2 trials that survived or diverged)
        """
        states = [r.state for r in records]
        return cls(*(states.count(s) for s in (TrialState.SURVIVED, TrialState.DIVERGED, TrialState.STOPPED,
                                               TrialState.FAILED)))

    @property
    def finished(self) -> int:
        """Every recorded trial."""
        return self.survived + self.diverged + self.stopped + self.failed

    @property
    def judged(self) -> int:
        """The denominator of :attr:`diverged_fraction`: trials that survived or diverged."""
        return self.survived + self.diverged

    @property
    def diverged_fraction(self) -> float:
        """``diverged / (survived + diverged)``; NaN when no trial survived or diverged."""
        return self.diverged / self.judged if self.judged else math.nan

    def fraction_text(self) -> str:
        """``diverged fraction 50% (4 of the 8 trials that survived or diverged)``."""
        share = f"{self.diverged_fraction:.0%}" if self.judged else "-"
        return f"diverged fraction {share} ({self.diverged} of the {self.judged} trials that survived or diverged)"

    def text(self) -> str:
        """``30 trials finished: 4 survived, 4 diverged, 22 stopped by the pruner, 0 failed``."""
        return (f"{self.finished} trials finished: {self.survived} survived, {self.diverged} diverged, "
                f"{self.stopped} stopped by the pruner, {self.failed} failed")

    def line(self) -> str:
        """:meth:`text`, then :meth:`fraction_text`: the one line report and the launch print."""
        return f"{self.text()}; {self.fraction_text()}"
