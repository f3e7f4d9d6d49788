"""Which of a trial's search seeds run, and when: a policy the search loop asks and then acts on.

By default every search seed runs at once (:class:`AllSeeds`). With ``--pruner first-seed``
(``tuner.driver.pruning.FirstSeedPruner``, whose :meth:`seed_policy` gives :class:`FirstSeed`) the
first seed runs alone and the others only if it kept up. The loop takes the policy from the study's
pruner (:func:`seed_policy`), so a pruner that comes with a seed rule carries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tuner.driver.outcome import Act, Decision
from tuner.records import TrialOutcome, TrialState


class SeedPolicy(Protocol):
    """Decides which of a trial's search seeds run first and whether the others (deferred) run."""

    def first(self, seeds: tuple[int, ...]) -> tuple[int, ...]:
        """The seeds that run when the trial starts; the rest wait for :meth:`after_first`."""
        ...

    def after_first(self, first: TrialOutcome, stopped: bool, best: Sequence[float]) -> Decision:
        """Once those seeds ended as ``first`` (``stopped``: the pruner stopped them): RUN the deferred
        seeds, or TELL the trial on the seeds it has (with a state and reason, or as its runs ended).
        ``best``: the validation losses of the trials that survived all their seeds."""
        ...


class AllSeeds:
    """Every search seed runs at once: nothing is deferred, so :meth:`after_first` is never asked."""

    def first(self, seeds: tuple[int, ...]) -> tuple[int, ...]:
        return seeds

    def after_first(self, first: TrialOutcome, stopped: bool, best: Sequence[float]) -> Decision:
        return Decision(Act.RUN)


@dataclass(frozen=True)
class FirstSeed:
    """The first seed runs alone; the others run only if it survived unstopped with a validation loss
    within ``val_factor`` x the best trial's (compared once ``min_trials`` trials survived all their
    seeds). Otherwise the trial ends on that seed: STOPPED when it was behind, else as it ended.

    Example:
        >>> from tuner.records import TrialOutcome, TrialState, TrainConfig
        >>> policy = FirstSeed(val_factor=1.2)
        >>> survived = TrialOutcome(5, TrainConfig(1e-3), TrialState.SURVIVED, (), value=0.3)
        >>> policy.after_first(survived, stopped=False, best=[0.2, 0.25, 0.4]).act  # 0.3 > 1.2 x 0.2
        <Act.TELL: 'tell'>
        >>> policy.after_first(survived, stopped=False, best=[0.26, 0.3, 0.4]).act
        <Act.RUN: 'run'>
    """

    val_factor: float
    min_trials: int = 3

    def first(self, seeds: tuple[int, ...]) -> tuple[int, ...]:
        return seeds[:1]

    def after_first(self, first: TrialOutcome, stopped: bool, best: Sequence[float]) -> Decision:
        if stopped or first.state is not TrialState.SURVIVED or first.value is None:
            return Decision(Act.TELL)  # it ends as its first seed did: diverged, failed or stopped
        if len(best) >= self.min_trials and first.value > self.val_factor * min(best):
            reason = (f"its first seed's validation loss {first.value:.4g} was more than {self.val_factor:g}x "
                      f"the best trial's {min(best):.4g}; its other seeds were not run")
            return Decision(Act.TELL, state=TrialState.STOPPED, reason=reason)
        return Decision(Act.RUN)


@runtime_checkable
class _CarriesSeedPolicy(Protocol):
    def seed_policy(self) -> SeedPolicy: ...


def seed_policy(pruner: object) -> SeedPolicy:
    """The seed policy ``pruner`` carries (``FirstSeedPruner``'s :class:`FirstSeed`), else :class:`AllSeeds`."""
    return pruner.seed_policy() if isinstance(pruner, _CarriesSeedPolicy) else AllSeeds()
