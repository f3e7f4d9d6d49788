"""How long a launch has left: the training steps still to run, at this launch's measured speed.

A launch's work is mostly known from its flags (:class:`Work`): ``--trials`` search trials of up to
``--seeds`` runs x ``--steps``; races of the trials that could lead, up to ``--race-seeds`` seeds;
``--verify-seeds`` runs x ``--verify-steps`` per verified candidate; the margin's passes of the
verification seeds x ``--steps`` (``tuner.driver.verify``). :class:`Eta` counts what is left in steps
and runs and turns them into seconds with this launch's own measurements: the seconds a run takes
per training step (worker-measured: the final records' ``train_seconds``; before a run has ended,
from its progress records' arrival times) plus the fixed cost of a run (graph build or reuse and the
two validation passes: ``run_seconds - train_seconds``), over the runs that train at once (the
slots, at most the runs of the phase). Trials finished per second are not used: the first trial's
time is mostly start-up, so that rate said "~1h20m left" for a 2.5-minute launch, and it left out
the phases after the search (72% of the default launch's steps).

What cannot be known beforehand is estimated, and corrected as the launch goes on:

- search steps (and runs) per trial: the mean over this launch's finished trials, counted with one
  prior trial that ran every seed to the end (``seeds x steps``). With ``--pruner first-seed`` the
  first trials do run every seed; later ones mostly run one seed, often stopped early, and the mean
  follows them;
- races: a trial races when it could lead; trial k of a launch leads about as often as it is the
  best of the first k, 1/k, so the trials left race sum(1/k) times (about 4 races in 30 trials), each
  costing the mean of this launch's races so far, counted with one prior full race (``race_seeds -
  seeds`` runs x ``steps``);
- verification: one candidate (the best usually meets the bar; a candidate that fails is followed
  by the next one, counted when it starts);
- margin: one pass of the verification seeds (a factor that diverges stops at its first divergence;
  after a pass that diverged or did not learn, one more pass while factors are left).

Everything here is plain data and a clock (no Optuna, Ray or rich): the tests drive it with a fake one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuner.driver.evidence import MARGIN_FACTORS
from tuner.records import Phase, RunRecord, RunStatus, TrialOutcome, TrialState

if TYPE_CHECKING:
    from tuner.config import LaunchConfig


@dataclass(frozen=True)
class Work:
    """What a launch trains, from its flags.

    Attributes:
        trials: search trials this launch runs (0: ``tuner verify``, one verification).
        steps: steps of a search, race and margin run.
        seeds: search seeds per trial.
        race_seeds: seeds a raced trial reaches (at or below ``seeds``: no racing).
        verify_seeds: runs per verified config (0: no verification).
        verify_steps: steps of a verification run.
        margin: whether the winner's learning-rate margin is measured (on the verification seeds).
        slots: runs that train at once.
    """

    trials: int
    steps: int
    seeds: int = 1
    race_seeds: int = 0
    verify_seeds: int = 0
    verify_steps: int = 0
    margin: bool = False
    slots: int = 1

    @classmethod
    def of_launch(cls, config: LaunchConfig, trials: int, slots: int) -> Work:
        """The work of a launch (``config``: its ``tuner.config.LaunchConfig``) that runs ``trials`` trials."""
        return cls(trials=trials, steps=config.steps, seeds=config.seeds, race_seeds=config.race_seeds,
                   verify_seeds=config.verify_seeds, verify_steps=config.verification_steps,
                   margin=config.margin and config.verify_seeds > 0, slots=slots)

    def run_steps(self, phase: Phase) -> int:
        """Steps of one run of ``phase``."""
        return self.verify_steps if phase is Phase.VERIFY else self.steps


@dataclass
class _Run:
    """One seed run as the view saw it."""

    first: tuple[float, int]  # (when, step) of its first progress record
    last: tuple[float, int]  # (when, step) of its latest one
    ended: bool = False


@dataclass
class _Mean:
    """A running mean that starts from one prior observation."""

    prior: float
    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total, self.count = self.total + value, self.count + 1

    @property
    def value(self) -> float:
        return (self.prior + self.total) / (1 + self.count)


@dataclass
class _Phase:
    """The runs of a race, verification or margin in flight."""

    phase: Phase
    runs: int  # runs submitted


@dataclass
class _Measured:
    """Worker-measured seconds: training steps and seconds, and the fixed cost of each run."""

    train_steps: int = 0
    train_seconds: float = 0.0
    fixed: list[float] = field(default_factory=list)


class Eta:
    """The time a launch has left (see the module docs).

    Args:
        work: what the launch trains.
        clock: seconds, monotonic (a fake one in the tests).
    """

    def __init__(self, work: Work, clock: Callable[[], float] = time.monotonic) -> None:
        self.work, self._clock = work, clock
        self._runs: dict[tuple[int, Phase], dict[int, _Run]] = {}  # (trial, phase) -> seed -> its run
        self._phases: dict[tuple[int, Phase], _Phase] = {}  # race, verification, margin in flight
        self._trials: set[int] = set()  # trials started and not finished
        self._finished = 0
        self._search = _Mean(work.seeds * work.steps)  # steps per trial
        self._search_runs = _Mean(work.seeds)
        self._race = _Mean(max(0, work.race_seeds - work.seeds) * work.steps)  # steps per race
        self._race_runs = _Mean(max(0, work.race_seeds - work.seeds))
        self._measured = _Measured()
        self._done: dict[Phase, int] = {Phase.VERIFY: 0, Phase.MARGIN: 0}  # phases ended
        self._more: dict[Phase, bool] = {Phase.VERIFY: True, Phase.MARGIN: work.margin}  # one more to come

    # ---- what the view hears

    def trial_started(self, number: int) -> None:
        """A search trial was asked."""
        self._trials.add(number)

    def phase_started(self, number: int, phase: Phase, runs: int) -> None:
        """``runs`` runs of a race, verification or margin were submitted."""
        self._phases[(number, phase)] = _Phase(phase, runs)
        if phase in self._more:
            self._more[phase] = False

    def record(self, record: RunRecord) -> None:
        """A progress or final record of any run."""
        now = self._clock()
        runs = self._runs.setdefault((record.trial, record.phase), {})
        run = runs.setdefault(record.seed, _Run((now, record.step), (now, record.step)))
        if not run.ended:
            run.last = (now, max(run.last[1], _trained(record) if record.final else record.step))
        if record.final and not run.ended:
            run.ended = True
            train = record.info.get("train_seconds")
            if record.status is RunStatus.SURVIVED and isinstance(train, (int, float)) and record.step > 0:
                self._measured.train_steps += record.step
                self._measured.train_seconds += float(train)
                fixed = float(record.info.get("run_seconds", train)) - float(train)
                self._measured.fixed.append(max(0.0, fixed))

    def phase_ended(self, outcome: TrialOutcome) -> None:
        """A race level, verification or margin pass ended with ``outcome``."""
        phase = outcome.phase
        self._phases.pop((outcome.number, phase), None)
        if phase in self._done:
            self._done[phase] += 1
            self._runs.pop((outcome.number, phase), None)
        if phase is Phase.MARGIN:  # a pass that diverged or did not learn: the next factor runs
            passed = outcome.state is TrialState.SURVIVED and outcome.learned is not False
            self._more[phase] = not passed and self._done[phase] < len(MARGIN_FACTORS)

    def trial_finished(self, number: int) -> None:
        """A search trial was told (its search runs and races are over)."""
        self._trials.discard(number)
        self._finished += 1
        search = self._runs.pop((number, Phase.SEARCH), {})
        self._search.add(sum(r.last[1] for r in search.values()))
        self._search_runs.add(len(search))
        race = self._runs.pop((number, Phase.RACE), {})
        if race:
            self._race.add(sum(r.last[1] for r in race.values()))
            self._race_runs.add(len(race))

    # ---- the estimate

    def left(self) -> float | None:
        """Seconds left (None until a run has trained measurably)."""
        per_step = self.seconds_per_step()
        if per_step is None:
            return None
        fixed = self.seconds_per_run()
        total = 0.0
        for phase, (steps, runs) in self.remaining().items():
            parallel = max(1, min(self.work.slots, self._width(phase)))
            total += (steps * per_step + runs * fixed) / parallel
        return total

    def remaining(self) -> dict[Phase, tuple[float, float]]:
        """Phase -> (steps, runs) still to train, estimated as the module docs say."""
        return {Phase.SEARCH: self._search_left(), Phase.RACE: self._race_left(),
                Phase.VERIFY: self._checks_left(Phase.VERIFY), Phase.MARGIN: self._checks_left(Phase.MARGIN)}

    def seconds_per_step(self) -> float | None:
        """A run's seconds per training step: worker-measured once a run survived, before that
        from the progress records' arrival times; None while nothing was measured."""
        m = self._measured
        if m.train_steps > 0 and m.train_seconds > 0:
            return m.train_seconds / m.train_steps
        runs = [r for seeds in self._runs.values() for r in seeds.values()]
        steps = sum(r.last[1] - r.first[1] for r in runs)
        seconds = sum(r.last[0] - r.first[0] for r in runs)
        return seconds / steps if steps > 0 and seconds > 0 else None

    def seconds_per_run(self) -> float:
        """The fixed cost of a run: graph build or reuse and its validation passes (0 until measured)."""
        fixed = self._measured.fixed
        return sum(fixed) / len(fixed) if fixed else 0.0

    def _search_left(self) -> tuple[float, float]:
        racing = {t for t, p in self._phases if p is Phase.RACE}
        searching = self._trials - racing
        unstarted = max(0, self.work.trials - self._finished - len(self._trials))
        steps, runs = self._running_left(searching, Phase.SEARCH, self._search.value, self._search_runs.value)
        return steps + unstarted * self._search.value, runs + unstarted * self._search_runs.value

    def _race_left(self) -> tuple[float, float]:
        if self.work.race_seeds <= self.work.seeds:
            return 0.0, 0.0
        racing = [t for t, p in self._phases if p is Phase.RACE]
        first = self._finished + len(racing) + 1  # the first trial that has not raced yet, counted from 1
        races = harmonic(first, self.work.trials)
        steps, runs = self._running_left(racing, Phase.RACE, self._race.value, self._race_runs.value)
        return steps + races * self._race.value, runs + races * self._race_runs.value

    def _running_left(self, numbers: Iterable[int], phase: Phase, steps_each: float,
                      runs_each: float) -> tuple[float, float]:
        """The steps and runs still to come of trials in ``phase``, each expected to train ``steps_each``
        steps in ``runs_each`` runs: what they have not trained yet, at least what is in flight."""
        steps = runs = 0.0
        for number in numbers:
            trained, in_flight, seen = self._trial_runs(number, phase)
            steps += max(steps_each - trained, in_flight)
            runs += max(0.0, runs_each - seen)
        return steps, runs

    def _checks_left(self, phase: Phase) -> tuple[float, float]:
        """A verification's or margin's runs: those in flight, and one more pass when one is to come."""
        if self.work.verify_seeds <= 0:
            return 0.0, 0.0
        run_steps = self.work.run_steps(phase)
        steps = runs = 0.0
        for (number, p), current in self._phases.items():
            if p is phase:
                _, in_flight, seen = self._trial_runs(number, phase)
                unseen = max(0, current.runs - seen)
                steps += in_flight + unseen * run_steps
                runs += unseen
        if self._more[phase]:
            steps += self.work.verify_seeds * run_steps
            runs += self.work.verify_seeds
        return steps, runs

    def _trial_runs(self, number: int, phase: Phase) -> tuple[int, int, int]:
        """(steps trained, steps left of its runs in flight, runs seen) of trial ``number``'s ``phase``."""
        runs = list(self._runs.get((number, phase), {}).values())
        run_steps = self.work.run_steps(phase)
        in_flight = sum(max(0, run_steps - r.last[1]) for r in runs if not r.ended)
        return sum(r.last[1] for r in runs), in_flight, len(runs)

    def _width(self, phase: Phase) -> int:
        """How many runs of ``phase`` can train at once."""
        if phase is Phase.SEARCH:
            return self.work.slots
        if phase is Phase.RACE:
            return max(1, self.work.race_seeds - self.work.seeds)
        return max(1, self.work.verify_seeds)



def harmonic(first: int, last: int) -> float:
    """``1/first + ... + 1/last`` (0 when ``first > last``): its first 1,000 terms, then their integral."""
    exact = min(last, first + 999)
    total = sum(1.0 / k for k in range(first, exact + 1))
    return total + (math.log((last + 0.5) / (exact + 0.5)) if last > exact else 0.0)


def _trained(record: RunRecord) -> int:
    """Steps a final record's run trained (a diverged step counts)."""
    return record.steps_survived + (record.status is RunStatus.DIVERGED)
