"""What the search loop and the verification share: the seams they run through, how a trial's runs
end as one state, and what a launch cost.

- :class:`Executor` runs seed runs and streams their records back; :class:`Callback` listens.
- :func:`judge` is the one place a trial's state is decided, from its seeds' final records and a
  :class:`Stop` when something stopped it while finite; it checks the state's invariants there
  (Optuna's ``optuna/study/_tell.py`` does the same before its one state write), and :func:`tell`
  hands the result to Optuna.
- :class:`Decision` is what a policy (racing: ``tuner.driver.racing``; which seeds run:
  ``tuner.driver.seeding``) answers the loop, which only acts on it (Ray Tune's schedulers answer
  ``on_trial_result`` with CONTINUE/STOP the same way).
- :class:`Compute` counts runs, steps and worker seconds per phase.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import optuna

from tuner.hooks import tell_pruned_without_value
from tuner.records import Phase, RunRecord, RunSpec, RunStatus, TrainConfig, TrialOutcome, TrialState

if TYPE_CHECKING:
    from tuner.driver.trialrecord import TrialRecord


class Executor(Protocol):
    """Runs seed runs somewhere and streams their records back (see tuner.driver.executor)."""

    def free(self) -> int:
        """Slots a newly submitted run would not wait for."""
        ...

    def submit(self, spec: RunSpec) -> None:
        """Queue one seed run."""
        ...

    def cancel(self, trial: int) -> None:
        """Cancel the trial's queued and running seed runs; each ends with a final record."""
        ...

    def poll(self, timeout: float) -> list[RunRecord]:
        """Records since the last call, waiting up to ``timeout`` seconds for one."""
        ...


class Callback(Protocol):
    """Hears about trials as they start, report and end (Ray Tune's vocabulary), and about the
    checks (race levels, verification, margin) a trial's config goes through."""

    def on_trial_start(self, number: int, config: TrainConfig, seeds: Sequence[int]) -> None:
        """A trial was asked and its search runs (on ``seeds``, in that order) submitted."""

    def on_trial_result(self, record: RunRecord) -> None:
        """A seed run (of any phase: ``record.phase``) streamed a record."""

    def on_trial_complete(self, outcome: TrialOutcome, record: TrialRecord) -> None:
        """A trial ended (its search runs and any race levels) and was told to Optuna: ``outcome``
        holds its runs' final records, ``record`` what the study keeps of it (its user attr), built
        once by the loop; a view shows the record and never reads it back or rebuilds it."""

    def on_phase_start(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Runs of another phase than the search started for trial ``number``'s config."""

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Those runs ended; ``outcome`` covers them alone (``outcome.phase``)."""


class Act(enum.Enum):
    """What a policy tells the loop to do with a trial whose runs ended."""

    RUN = "run"  # run more seeds: its deferred ones, or up to a race level (``Decision.seeds``)
    WAIT = "wait"  # neither run nor tell it: other trials' races decide whether it could lead
    TELL = "tell"  # end it: tell Optuna, with ``Decision.state`` and ``Decision.reason`` where given


@dataclass(frozen=True)
class Decision:
    """A policy's answer about one trial (see :class:`Act`)."""

    act: Act
    seeds: int = 0  # RUN to a race level: the seeds the trial has then
    state: TrialState | None = None  # TELL: the state the policy ends it in (None: as its runs ended)
    reason: str = ""  # TELL: why (a stop's reason, or why it was not raced)


@dataclass(frozen=True)
class Stop:
    """A finite trial stopped because it was behind: by the pruner at ``step`` (its runs cancelled), or
    after its runs ended (``ended``: the first-seed rule ends a trial whose first seed survived)."""

    step: int
    reason: str
    ended: bool = False


def judge(number: int, config: TrainConfig, finals: dict[int, RunRecord], phase: Phase = Phase.SEARCH,
          stop: Stop | None = None) -> TrialOutcome:
    """The state of a trial from its seeds' final records (in the order they were given) and its stop.

    A diverged seed makes it PRUNED (diverged), then a failed seed FAIL; a trial ``stop`` cut short
    (or, ``stop.ended``, ended after its runs) is STOPPED with the stop's reason and no value; a
    seed run that ended early for another reason makes it FAIL; else every seed survived: COMPLETE,
    with the mean validation loss. Raises RuntimeError when the result breaks a state's invariant.
    """
    seeds = tuple(finals.values())
    failed = [r for r in seeds if r.status is RunStatus.FAILED]
    cut = any(r.status is not RunStatus.SURVIVED for r in seeds)
    if any(r.status is RunStatus.DIVERGED for r in seeds):
        outcome = TrialOutcome(number, config, TrialState.DIVERGED, seeds, phase=phase)
    elif failed:
        outcome = TrialOutcome(number, config, TrialState.FAILED, seeds, reason=failed[0].error or "failed",
                               phase=phase)
    elif stop is not None and (cut or stop.ended):
        outcome = TrialOutcome(number, config, TrialState.STOPPED, seeds, reason=stop.reason, phase=phase)
    elif cut:
        outcome = TrialOutcome(number, config, TrialState.FAILED, seeds, reason="a seed run ended early", phase=phase)
    else:
        value = statistics.fmean(r.val_loss for r in seeds if r.val_loss is not None)
        outcome = TrialOutcome(number, config, TrialState.SURVIVED, seeds, value=value, phase=phase)
    check(outcome)
    return outcome


def check(outcome: TrialOutcome) -> None:
    """Raise RuntimeError when ``outcome`` breaks its state's invariant: a COMPLETE trial has a value;
    a diverged (PRUNED) one a diverged seed and no value; a STOPPED or FAIL one a reason and no value."""
    state, problem = outcome.state, ""
    if state is TrialState.SURVIVED and outcome.value is None:
        problem = "a survived trial has no value"
    elif state is not TrialState.SURVIVED and outcome.value is not None:
        problem = f"a {state.value} trial has a value"
    elif state is TrialState.DIVERGED and outcome.divergence is None:
        problem = "a diverged trial has no diverged seed"
    elif state in (TrialState.STOPPED, TrialState.FAILED) and not outcome.reason:
        problem = f"a {state.value} trial has no reason"
    if problem:
        raise RuntimeError(f"trial {outcome.number}: {problem} (a bug in tuner: please report it)")


OPTUNA_STATE = {  # how Optuna holds each state: a stopped trial is PRUNED too, but never counts as diverged
    TrialState.SURVIVED: optuna.trial.TrialState.COMPLETE,
    TrialState.DIVERGED: optuna.trial.TrialState.PRUNED,
    TrialState.STOPPED: optuna.trial.TrialState.PRUNED,
    TrialState.FAILED: optuna.trial.TrialState.FAIL,
}


def tell(study: optuna.Study, number: int, outcome: TrialOutcome) -> None:
    """Tell Optuna how trial ``number`` ended; a trial the pruner stopped gets no value.

    ``study.tell(state=PRUNED)`` gives a pruned trial its last intermediate value as its value when that
    is finite (``optuna/study/_tell.py``): the last *training* loss of a stopped trial, which
    optuna-dashboard then plots on the ``val_loss`` axis. TPE ranks pruned trials by their
    intermediate values alone (last step, then last value: ``_get_pruned_trial_score``), never by
    the value, so a stopped trial is told with no value and TPE sees the same trials. A diverged
    trial's last intermediate value is NaN already (``Search._report_values``).
    """
    if outcome.state is not TrialState.STOPPED or not tell_pruned_without_value(study, number):
        study.tell(number, outcome.value, state=OPTUNA_STATE[outcome.state])


@dataclass
class Compute:
    """Seed runs, training steps and worker seconds per phase: what a launch cost.

    Seconds are a run's time in its worker, build or reuse of its graph to its final record
    (``info["run_seconds"]``); a run cancelled before its worker sent a final record counts none.
    """

    runs: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, record: RunRecord) -> None:
        """Count a final record: the steps its run trained (a diverged step counts)."""
        phase = record.phase.value
        trained = record.steps_survived + (record.status is RunStatus.DIVERGED)
        self.runs[phase] = self.runs.get(phase, 0) + 1
        self.steps[phase] = self.steps.get(phase, 0) + trained
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(record.info.get("run_seconds", 0.0))

    def merge(self, other: Compute) -> None:
        """Add ``other``'s counts to these."""
        for phase, runs in other.runs.items():
            self.runs[phase] = self.runs.get(phase, 0) + runs
            self.steps[phase] = self.steps.get(phase, 0) + other.steps.get(phase, 0)
            self.seconds[phase] = self.seconds.get(phase, 0.0) + other.seconds.get(phase, 0.0)

    def by_phase(self) -> dict[str, dict[str, float]]:
        """phase -> {runs, steps, seconds}."""
        return {p: {"runs": float(self.runs[p]), "steps": float(self.steps.get(p, 0)),
                    "seconds": round(self.seconds.get(p, 0.0), 3)} for p in self.runs}
