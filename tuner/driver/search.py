"""The search driver: Optuna ask/tell over seed runs streamed back by an executor.

A trial is one config on K seeds, run in parallel (with ``--pruner first-seed``, the default: its first
seed alone, then the others in parallel if it kept up; :class:`FirstSeedPruner`). How a trial ends
(see docs/concepts.md):

- every seed reached the budget: COMPLETE, with the validation loss averaged over seeds;
- a seed went non-finite at step s: each sibling is cancelled once it has passed step s (or ended
  by itself), so a sibling that would diverge before s does, and the trial's earliest divergence
  does not depend on which worker ran faster; NaN is reported as the intermediate value at that
  step (TPE ranks pruned trials by their last reported step; the trial gets no value) and the trial
  is PRUNED;
- a seed failed (model error, or its worker died more than ``max_retries`` times): FAIL;
- the pruner found a finite trial behind: STOPPED (told PRUNED, never counted as diverged).

A trial's seeds come from the study's seed stream (``tuner.driver.evidence.SeedStream``), not 0..K-1
for every trial. A COMPLETE trial that could become the best races on more seeds before it is
told (see :class:`Search`). A COMPLETE trial whose validation loss is not below its loss at
initialisation did not learn (``TrialRecord.learned``): it is never raced nor exported. What the
search learned about a trial is written once, as its :class:`~tuner.driver.trialrecord.TrialRecord`.

Only this driver talks to the Optuna storage; callbacks (MLflow tracking, the terminal view) hear
``on_trial_start``, ``on_trial_result`` and ``on_trial_complete``, and ``on_phase_start`` /
``on_phase_end`` for the race levels, verification and margin runs of a config. A callback only
listens (optuna-integration's MLflowCallback): the search never asks one anything back, so a
trial's record holds nothing a callback made (its MLflow run is found by its tags:
``tuner.driver.mlflow_runs``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import optuna

from tuner.driver import signals
from tuner.driver.evidence import SeedStream
from tuner.driver.intermediate import Reports
from tuner.driver.liveness import DUPLICATE_OF, Liveness
from tuner.driver.trialrecord import ATTR, TrialRecord, read
from tuner.hooks import is_enqueued, tell_pruned_without_value
from tuner.records import Phase, RunRecord, RunSpec, RunStatus, Skip, TrainConfig, TrialOutcome, TrialState
from tuner.spaces import SearchSpace

log = logging.getLogger(__name__)
RACE_Z = 1.0  # a challenger races past a trial on more seeds only when better by this many standard errors
_MAX_DUPLICATES = 20  # duplicates asked in one launch after which the space counts as exhausted
_OPTUNA_STATE = {
    TrialState.COMPLETE: optuna.trial.TrialState.COMPLETE,
    TrialState.PRUNED: optuna.trial.TrialState.PRUNED,
    TrialState.STOPPED: optuna.trial.TrialState.PRUNED,
    TrialState.FAIL: optuna.trial.TrialState.FAIL,
}


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

    def on_trial_complete(self, outcome: TrialOutcome) -> None:
        """A trial ended (its search runs and any race levels) and was told to Optuna."""

    def on_phase_start(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Runs of another phase than the search started for trial ``number``'s config."""

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Those runs ended; ``outcome`` covers them alone (``outcome.phase``)."""


@dataclass(frozen=True)
class Budget:
    """How much a launch trains: trials to finish, steps and seeds per trial, seeds to race to.

    Attributes:
        race_seeds: seeds a trial that could become the best must survive before it may be
            exported; it earns them by doubling from ``seeds`` (2 -> 4 -> 8). At or below
            ``seeds``, nothing is raced.
    """

    trials: int
    steps: int
    seeds: int = 2
    report_every: int = 25
    threads: int = 1
    race_seeds: int = 0
    prune_from: int = 0  # the first step at which the study's pruner may stop a finite trial (0: never)

    def race_levels(self) -> tuple[int, ...]:
        """The seed counts a raced trial reaches after its search seeds (2 -> 4 -> 8: (4, 8))."""
        levels, count = [], self.seeds
        while count < self.race_seeds:
            count = min(2 * count, self.race_seeds)
            levels.append(count)
        return tuple(levels)


@dataclass
class _Trial:
    """A trial in flight: the runs of its current phase, and the final records of earlier ones."""

    trial: optuna.trial.Trial
    config: TrainConfig
    seeds: tuple[int, ...]
    phase: Phase = Phase.SEARCH
    finals: dict[int, RunRecord] = field(default_factory=dict)  # seed -> final record, this phase
    earlier: dict[int, RunRecord] = field(default_factory=dict)  # seed -> final record, earlier phases
    losses: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> seed -> loss
    reported: set[int] = field(default_factory=set)
    reached: dict[int, int] = field(default_factory=dict)  # seed -> last step it reported, this phase
    diverged_at: int | None = None  # the earliest divergence step seen in this phase
    cancelled: bool = False
    stopped_at: int | None = None  # the step at which the pruner stopped it
    deferred: tuple[int, ...] = ()  # seeds that run once the first one kept up (``--pruner first-seed``)
    behind: str = ""  # why its first seed's validation loss stopped it (``--pruner first-seed``)

    def records(self, phase_only: bool = False) -> dict[int, RunRecord]:
        """Final records in seed order (search seeds first): this phase's, or every phase's."""
        done = self.finals if phase_only else {**self.earlier, **self.finals}
        order = self.seeds if phase_only else (*self.earlier, *self.seeds)
        return {s: done[s] for s in order if s in done}


class Search:
    """Runs ``budget.trials`` trials of ``space`` on ``executor`` (see the module docs).

    Racing (SMAC3's intensification): a trial whose seeds all survived and that could become the
    best is not told yet: it runs on the next race level's seeds, shared by every raced trial. It
    could become the best when its validation loss is below that of every trial that survived as
    many seeds, and below that of every trial that survived more seeds by more than the seeds'
    noise (``RACE_Z`` standard errors of the difference, from that trial's spread over its seeds):
    a challenger within the noise of a raced incumbent is not worth its race runs. One diverging
    race seed makes it PRUNED (TPE is told); a trial that falls behind stops racing and is told
    COMPLETE on the seeds it has. A trial behind only trials still racing waits (no runs, not
    told) until their races decide whether it could lead. ``stream`` gives every run its seed.
    """

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        model: str,
        executor: Executor,
        budget: Budget,
        callbacks: Sequence[Callback] = (),
        skip: Skip | None = None,
        stream: SeedStream | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        self.study, self.space, self.model = study, space, model
        self.skip = skip or Skip()  # samples the data preflight left out of every run
        self.executor, self.budget, self.callbacks = executor, budget, list(callbacks)
        self.stream = stream or SeedStream(0)
        self._active: dict[int, _Trial] = {}
        self._reports = Reports()  # intermediate values, written in batches (tuner.driver.intermediate)
        self.outcomes: list[TrialOutcome] = []
        self.compute = Compute()
        # trial number -> (seeds survived, validation loss) of every trial that survived and learned
        self._standing: dict[int, tuple[int, float]] = standing(study)
        # trial number -> params of the configs earlier launches trained: never trained again
        self._held = {t.number: t.params for t in study.get_trials(deepcopy=False)
                      if t.state.is_finished() and DUPLICATE_OF not in t.user_attrs}
        self._racing: set[int] = set()  # trials whose race runs are in flight
        self._spread: dict[int, float] = {}  # trial number -> standard deviation of its seeds' validation losses
        self._waiting: dict[int, TrialOutcome] = {}  # trials waiting for a race to decide theirs
        self.liveness = liveness  # heartbeats and a study shared with other drivers (None: this one alone)
        self._open: tuple[float, int, int] = (0.0, 0, 0)  # (when counted, trials to ask, others' running)
        self.duplicates = 0  # trials asked whose config the study already held (told FAIL, not trained)

    def run(self, trials: int | None = None) -> list[TrialOutcome]:
        """Ask and finish ``trials`` trials (default: the budget's), then return their outcomes.

        With ``liveness``, the study may be shared: trials are asked while the study holds fewer
        than ``budget.trials`` finished or running ones, and the loop also waits for other drivers'
        running trials (a dead driver's are queued again after the grace period, and run here).
        """
        to_ask = self.budget.trials if trials is None else trials
        while True:
            others = 0
            if self.liveness is not None:
                self.liveness.maintain()
                to_ask, others = self._study_open()
            while to_ask > 0 and self.executor.free() > 0 and self.duplicates < _MAX_DUPLICATES:
                if self._start_trial():
                    to_ask -= 1
                    self._open = (self._open[0], self._open[1] - 1, self._open[2])
            if not self._active and (to_ask <= 0 or self.duplicates >= _MAX_DUPLICATES):
                if not others:
                    return self.outcomes
                time.sleep(0.5)  # only other drivers' trials are left: wait for them to end or go stale
            for record in self.executor.poll(timeout=0.5):
                self._on_record(record)
            signals.raise_if_dropped()
            self._reports.flush_due()

    def _study_open(self) -> tuple[int, int]:
        """(trials to ask, other drivers' running trials), counted in the study at most once a second."""
        when, _, _ = self._open
        if time.monotonic() - when >= 1.0 and self.liveness is not None:
            self._open = (time.monotonic(), *self.liveness.open_trials(self.budget.trials))
        return self._open[1], self._open[2]

    def _start_trial(self) -> bool:
        """Ask a trial and submit its search runs; False if its config was already trained (told FAIL)."""
        trial = self.study.ask()
        if self.liveness is not None:
            self.liveness.claim(trial)
        config = self.space.suggest(trial)
        twin = self._twin(trial)
        if twin is not None:
            self._skip_duplicate(trial, twin)
            return False
        seeds = self.stream.search(trial.number, self.budget.seeds)
        first = seeds[:1] if isinstance(self.study.pruner, FirstSeedPruner) else seeds
        self._active[trial.number] = _Trial(trial, config, first, deferred=seeds[len(first):])
        for cb in self.callbacks:
            cb.on_trial_start(trial.number, config, seeds)
        self._submit(trial.number, config, first, Phase.SEARCH)
        return True

    def _twin(self, trial: optuna.trial.Trial) -> int | None:
        """The earlier launch's trial whose config this one repeats (a resumed study never replays a
        config it trained); None for an enqueued trial (a rerun, or a config a user asked for)."""
        if not self._held or is_enqueued(trial):
            return None
        return next((number for number, params in self._held.items() if params == trial.params), None)

    def _skip_duplicate(self, trial: optuna.trial.Trial, twin: int) -> None:
        """Tell a trial that repeats trial ``twin``'s config FAIL without training it; reseed the sampler.

        A continued launch reseeds its sampler (tuner.driver.launch.open_study), so this happens only in a
        small discrete space; after ``_MAX_DUPLICATES`` the space counts as exhausted.
        """
        trial.set_user_attr(DUPLICATE_OF, twin)
        trial.set_user_attr("reason", f"same config as trial {twin}: not trained again")
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if self.liveness is not None:
            self.liveness.release(trial.number)
        self.study.sampler.reseed_rng()
        self.duplicates += 1
        if self.duplicates == _MAX_DUPLICATES:
            log.warning("%d suggested configs were trained by earlier launches already: the search space looks "
                        "exhausted; no more trials are asked", self.duplicates)

    def _submit(self, number: int, config: TrainConfig, seeds: Sequence[int], phase: Phase) -> None:
        b = self.budget
        for seed in seeds:
            self.executor.submit(RunSpec(number, seed, self.model, config, b.steps, b.report_every, b.threads,
                                         skip=self.skip, phase=phase))

    def _on_record(self, record: RunRecord) -> None:
        active = self._active.get(record.trial)
        if active is None or record.phase is not active.phase or record.seed not in active.seeds:
            return
        for cb in self.callbacks:
            cb.on_trial_result(record)
        active.reached[record.seed] = record.step
        if record.status is RunStatus.FAILED and not active.cancelled:
            active.cancelled = True  # a broken run: stop the others now
            self.executor.cancel(record.trial)
        if record.status is RunStatus.DIVERGED:
            active.diverged_at = min(record.step, active.diverged_at or record.step)
        if record.final:
            active.finals[record.seed] = record
        self._cancel_past_divergence(active)
        if not record.final:
            if record.status is RunStatus.RUNNING and active.phase is Phase.SEARCH:
                self._report_progress(active, record)
            return
        self.compute.add(record)
        if len(active.finals) == len(active.seeds):
            self._phase_done(active)

    def _cancel_past_divergence(self, active: _Trial) -> None:
        """One unstable seed makes the config unstable: once a seed diverged at step s, cancel the
        trial's other runs as soon as each has passed step s or ended (a sibling that would diverge
        before s still does, so the earliest divergence is the same however fast each worker ran)."""
        first = active.diverged_at
        if first is None or active.cancelled:
            return
        if len(active.finals) < len(active.seeds) and all(
                s in active.finals or active.reached.get(s, 0) >= first for s in active.seeds):
            active.cancelled = True
            self.executor.cancel(active.trial.number)

    def _report_progress(self, active: _Trial, record: RunRecord) -> None:
        """Report the mean training loss at a step once every seed has reached it (each seed's
        ``loss_mean`` since its last report where the record has it, else its last batch's)."""
        at_step = active.losses.setdefault(record.step, {})
        loss = record.metrics.get("loss_mean", record.loss)
        at_step[record.seed] = loss if loss is not None else float("nan")
        if len(at_step) == len(active.seeds) and record.step not in active.reported:
            self._reports.add(active.trial, record.step, statistics.fmean(at_step.values()))
            active.reported.add(record.step)
            del active.losses[record.step]
            if 0 < self.budget.prune_from <= record.step < self.budget.steps:
                self._reports.flush(active.trial)  # the pruner reads the trial's values from the storage
                if active.trial.should_prune():
                    self._stop(active, record.step)

    def _stop(self, active: _Trial, step: int) -> None:
        """The pruner found this finite trial behind: stop its runs (it is not a divergence)."""
        if not active.cancelled:
            active.cancelled, active.stopped_at = True, step
            self.executor.cancel(active.trial.number)

    def _phase_done(self, active: _Trial) -> None:
        number = active.trial.number
        if active.deferred and self._first_seed_kept_up(active):
            return
        if active.phase is not Phase.SEARCH:
            part = judge(number, active.config, active.records(phase_only=True), phase=active.phase)
            for cb in self.callbacks:
                cb.on_phase_end(part)
        outcome = judge(number, active.config, active.records())
        if active.stopped_at is not None and outcome.state is TrialState.FAIL and all(
            r.status is not RunStatus.FAILED for r in outcome.seeds
        ):
            reason = stop_reason(self.study.pruner, active.stopped_at)
            outcome = replace(outcome, state=TrialState.STOPPED, reason=reason)
        elif active.behind and outcome.state is TrialState.COMPLETE:  # its first seed was behind
            outcome = replace(outcome, state=TrialState.STOPPED, value=None, reason=active.behind)
        self._standing.pop(number, None)
        self._racing.discard(number)
        if outcome.state is TrialState.COMPLETE and outcome.learned is not False and outcome.value is not None:
            self._standing[number] = (len(outcome.seeds), outcome.value)
            losses = [r.val_loss for r in outcome.seeds if r.val_loss is not None]
            self._spread[number] = statistics.stdev(losses) if len(losses) > 1 else 0.0
            self._decide(active, outcome)
        else:
            self._finish(active, outcome)
        for waiting in sorted(self._waiting.values(), key=lambda o: o.value or 0.0):
            del self._waiting[waiting.number]
            self._decide(self._active[waiting.number], waiting)

    def _first_seed_kept_up(self, active: _Trial) -> bool:
        """``--pruner first-seed``, once the first seed ended: run the deferred seeds (True) if it
        survived with a validation loss within ``val_factor`` x the best trial's; otherwise the trial
        ends on that seed (STOPPED, or as the seed ended: diverged, failed or stopped)."""
        pruner = self.study.pruner
        assert isinstance(pruner, FirstSeedPruner)
        first = judge(active.trial.number, active.config, active.records())
        if active.stopped_at is not None or first.state is not TrialState.COMPLETE or first.value is None:
            return False
        best = [value for _, value in self._standing.values()]
        if pruner.behind_after_first(first.value, best):
            active.stopped_at = self.budget.steps
            active.behind = (f"its first seed's validation loss {first.value:.4g} was more than {pruner.val_factor:g}x "
                             f"the best trial's {min(best):.4g}; its other seeds were not run")
            return False
        deferred, active.deferred = active.deferred, ()
        active.seeds = (*active.seeds, *deferred)
        self._submit(active.trial.number, active.config, deferred, Phase.SEARCH)
        return True

    def _decide(self, active: _Trial, outcome: TrialOutcome) -> None:
        """Race the trial on, let it wait for a race that decides whether it could win, or tell it."""
        have, number = len(outcome.seeds), outcome.number
        level = next((n for n in self.budget.race_levels() if n > have), None)
        better = [n for n, (seeds, value) in self._standing.items()
                  if n != number and seeds >= have and outcome.value is not None
                  and value <= outcome.value + self._noise(n, seeds, have)]
        if level is not None and not better:
            self._race(active, level)
        elif level is not None and all(n in self._racing for n in better):
            self._waiting[number] = outcome  # behind trials still racing: it may lead once they fall out
        else:
            if level is not None:  # why it was not raced on, in the record (tuner.driver.trialrecord.why_not)
                leader = min(better, key=lambda n: self._standing[n][1])
                outcome = replace(outcome, reason=self._not_raced(outcome, leader))
            self._finish(active, outcome)

    def _not_raced(self, outcome: TrialOutcome, leader: int) -> str:
        """``0.0473 on 2 seeds is within 1 standard error of trial 4's 0.0545 on 8 seeds; not raced``, or
        ``behind trial 4's 0.0545 on 8 seeds; not raced``."""
        seeds, value = self._standing[leader]
        mine = f"{outcome.value:.4g} on {len(outcome.seeds)} seeds"
        theirs = f"trial {leader}'s {value:.4g} on {seeds} seeds"
        further = " further" if len(outcome.seeds) > self.budget.seeds else ""
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

    def _race(self, active: _Trial, level: int) -> None:
        raced = len(active.earlier) + len(active.finals) - self.budget.seeds
        seeds = self.stream.race(level - self.budget.seeds)[raced:]
        active.earlier.update(active.records(phase_only=True))
        active.finals, active.seeds, active.phase, active.cancelled = {}, seeds, Phase.RACE, False
        active.reached, active.diverged_at = {}, None
        self._racing.add(active.trial.number)
        for cb in self.callbacks:
            cb.on_phase_start(active.trial.number, Phase.RACE, active.config, seeds)
        self._submit(active.trial.number, active.config, seeds, Phase.RACE)

    def _finish(self, active: _Trial, outcome: TrialOutcome) -> None:
        number = active.trial.number
        record = TrialRecord.from_outcome(outcome, self.budget.steps, active.stopped_at)
        try:
            self._report_values(active, outcome)  # its intermediate values, before it is told
            active.trial.set_user_attr(ATTR, record.to_dict())
            tell(self.study, number, outcome)
        except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale by another launch: rerun there
            log.warning("trial %d was marked FAIL by another launch (its heartbeat was late); its rerun counts",
                        number)
        if self.liveness is not None:
            self.liveness.release(number)
        del self._active[number]
        self.outcomes.append(outcome)
        for cb in self.callbacks:
            cb.on_trial_complete(outcome)

    def _report_values(self, active: _Trial, outcome: TrialOutcome) -> None:
        """Write the trial's values; a diverged trial's end with NaN at its divergence step.

        The NaN goes at the step its earliest seed diverged at: the step its record and MLflow tags
        give. A seed run after the first ones (the deferred seeds of ``--pruner first-seed``, a race
        seed) may diverge before a step those reported: their values from that step on are taken
        back first (:meth:`~tuner.driver.intermediate.Reports.retract`), so the NaN is the last
        value (where a storage cannot take them back, it goes after them). TPE ranks a pruned trial
        by its last reported step, so by how long it survived, and Optuna gives a PRUNED trial whose
        last value is NaN no value, so a diverged trial's training loss is not shown as its
        validation loss (optuna-dashboard's history and slice plots draw trials' values on the
        val_loss axis).
        """
        first = outcome.divergence if outcome.state is TrialState.PRUNED else None
        if first is None:
            self._reports.flush(active.trial)
            return
        kept = self._reports.retract(active.trial, first.step)  # and the rest written
        active.trial.report(float("nan"), first.step if kept is None else kept + 1)


def tell(study: optuna.Study, number: int, outcome: TrialOutcome) -> None:
    """Tell Optuna how trial ``number`` ended; a trial the pruner stopped gets no value.

    ``study.tell(state=PRUNED)`` gives a pruned trial its last intermediate value as its value when that
    is finite (``optuna/study/_tell.py``): the last *training* loss of a stopped trial, which
    optuna-dashboard then plots on the ``val_loss`` axis. TPE ranks pruned trials by their
    intermediate values alone (last step, then last value: ``_get_pruned_trial_score``), never by
    the value, so a stopped trial is told with no value and TPE sees the same trials. A diverged
    trial's last intermediate value is NaN already (:meth:`Search._report_values`).
    """
    if outcome.state is not TrialState.STOPPED or not tell_pruned_without_value(study, number):
        study.tell(number, outcome.value, state=_OPTUNA_STATE[outcome.state])


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


def standing(study: optuna.Study) -> dict[int, tuple[int, float]]:
    """Trial number -> (seeds survived, validation loss) of the study's COMPLETE trials that learned."""
    out = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        record = read(t)
        if t.value is not None and record is not None and record.learned is not False:
            out[t.number] = (len(record.seeds), float(t.value))
    return out


def make_sampler(kind: str, seed: int | None, searched: int) -> optuna.samplers.BaseSampler:
    """The study's sampler: ``random``, or ``tpe`` (multivariate, constant liar for parallel trials).

    TPE starts from ``2 x searched`` random trials, between 4 and Optuna's default of 10: on a
    small space ten random trials often find a good config before TPE has had its say.
    """
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    startup = min(10, max(4, 2 * searched))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # ``group`` is experimental
        # group: a nullable knob's value is suggested only when ``use_<name>`` is true (tuner.spaces.Param),
        # and TPE models each set of params that occur together instead of sampling them independently
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=startup)


ASHA_REDUCTION = 3  # successive halving keeps the best third of the trials at each rung
BEHIND_FACTOR = 1.5  # ``behind`` stops a trial whose loss is above this many times the best at the same step
FIRST_SEED_FACTOR = 3.0  # ``first-seed``: its training-loss rule, while the first seed runs
FIRST_SEED_VAL_FACTOR = 1.2  # ``first-seed``: the first seed's validation loss against the best trial's


class BehindBestPruner(optuna.pruners.BasePruner):
    """Stop a trial whose loss at a step is more than ``factor`` x the lowest loss that a finished
    trial (survived, diverged later, or stopped later) had at the same step, between ``min_step``
    and ``max_step`` and once ``min_trials`` finished trials reached that step. Running trials are
    not compared: their values reach the storage in batches (tuner.driver.intermediate).

    Chosen with bench/pruner_replay.py and real launches (BENCHMARKS.md): the training loss ranks the
    final validation loss weakly on the shipped models (Spearman about 0.6 at a quarter of the
    steps), so a rank cut (ASHA's best third) stops the eventual best too often; a trial far behind
    the best is rarely the winner. Late in a run the training loss sits on a floor of batch noise
    (4-5x the validation loss on iterated_mlp), where the ratio stops good trials for little
    saving, hence ``max_step``.
    """

    def __init__(self, min_step: int, max_step: int | None = None, factor: float = BEHIND_FACTOR,
                 min_trials: int = 3) -> None:
        self.min_step, self.max_step, self.factor, self.min_trials = min_step, max_step, factor, min_trials

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.min_step or (self.max_step is not None and step > self.max_step):
            return False
        value = trial.intermediate_values[step]
        if not math.isfinite(value):
            return False  # a divergence is the search's to report, not the pruner's
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        others = [v for t in study.get_trials(deepcopy=False, states=finished)
                  if (v := t.intermediate_values.get(step)) is not None and math.isfinite(v)]
        return len(others) >= self.min_trials and value > self.factor * min(others)


class FirstSeedPruner(BehindBestPruner):
    """Run a trial's first seed alone; its other seeds run only if that seed kept up.

    While the first seed trains (the trial's reported values are that seed's), it is stopped above
    ``factor`` x the lowest loss a finished trial's first seed had at the same step, between
    ``min_step`` and ``max_step`` (:class:`BehindBestPruner`). When it survives to the end, the
    search asks :meth:`behind_after_first`: a first seed whose validation loss is above
    ``val_factor`` x the best validation loss of a trial that survived all its seeds stops the trial
    there, its other seeds never run.

    Why (BENCHMARKS.md, bench/pruner_signals.py): on iterated_mlp one seed's final validation loss
    ranks another seed's better (Spearman 0.69) than any reading a quarter of the way in does
    (0.59), and a trial stopped after its first seed saves that seed's siblings whole. In 21 real
    launches at the default budget it trained 38.5 % fewer search steps (median) than no pruner,
    with exports as good as a distribution (median held-out validation loss 1.004x); so it is the
    default.
    """

    def __init__(self, min_step: int, max_step: int | None = None, factor: float = FIRST_SEED_FACTOR,
                 val_factor: float = FIRST_SEED_VAL_FACTOR, min_trials: int = 3) -> None:
        super().__init__(min_step, max_step, factor, min_trials)
        self.val_factor = val_factor

    def behind_after_first(self, val_loss: float, best: Sequence[float]) -> bool:
        """Whether a first seed that survived with ``val_loss`` is behind ``best`` (the validation
        losses of the trials that survived all their seeds; none is compared under ``min_trials``)."""
        return len(best) >= self.min_trials and val_loss > self.val_factor * min(best)


def prune_start(kind: str, steps: int) -> int:
    """The first step at which ``kind`` may stop a finite trial (0: never): half the steps for
    ``median``, a quarter for ``behind`` and ``asha`` (its first rung; the next ones at 3x and 9x
    that step), a sixth for ``first-seed``."""
    return {"median": steps // 2, "behind": max(1, steps // 4), "asha": max(1, steps // 4),
            "first-seed": max(1, steps // 6)}.get(kind, 0)


def make_pruner(kind: str, steps: int = 0) -> optuna.pruners.BasePruner:
    """The study's pruner for trials of ``steps`` steps: ``none``, ``behind``, ``first-seed``,
    ``median`` or ``asha``.

    Each only ever stops a finite trial whose mean training loss (``loss_mean``, over the steps
    since the last report, the seeds averaged) is behind, and only from :func:`prune_start` on:
    such a trial is STOPPED, never counted as diverged. ``behind``: above 1.5x the lowest loss a
    finished trial had at the same step, up to half the steps (:class:`BehindBestPruner`).
    ``first-seed``: a trial's first seed runs alone and is stopped above 3x the lowest loss a
    finished trial's first seed had at the same step (a sixth to half the steps); its other seeds
    run only if its validation loss is within 1.2x the best trial's (:class:`FirstSeedPruner`).
    ``median``: behind the median of the completed trials at the same step (Optuna's MedianPruner
    once 5 trials completed). ``asha``: not in the best third of the trials that reached the same
    rung (Optuna's SuccessiveHalvingPruner, asynchronous: rungs at a quarter of the steps, then 3x,
    9x that).
    """
    if kind == "behind":
        return BehindBestPruner(prune_start(kind, steps), max_step=steps // 2)
    if kind == "first-seed":
        return FirstSeedPruner(prune_start(kind, steps), max_step=steps // 2)
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    if kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=prune_start(kind, steps), reduction_factor=ASHA_REDUCTION, min_early_stopping_rate=0)
    return optuna.pruners.NopPruner()


def stop_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    """Why ``pruner`` stopped a finite trial at ``step``, in words."""
    if isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner):
        return f"at step {step} its loss was not in the best third of the trials that reached that step"
    if isinstance(pruner, FirstSeedPruner):
        return (f"at step {step} its first seed's loss was more than {pruner.factor:g}x the lowest loss a finished "
                "trial's first seed had at that step; its other seeds were not run")
    if isinstance(pruner, BehindBestPruner):
        return (f"at step {step} its loss was more than {pruner.factor:g}x the lowest loss a finished trial had "
                "at that step")
    return f"at step {step} its loss was behind the median of the completed trials"


def judge(
    number: int, config: TrainConfig, finals: dict[int, RunRecord], phase: Phase = Phase.SEARCH
) -> TrialOutcome:
    """The state of a trial from its seeds' final records (in the order they were given):
    diverged > failed > survived."""
    seeds = tuple(finals.values())
    if any(r.status is RunStatus.DIVERGED for r in seeds):
        return TrialOutcome(number, config, TrialState.PRUNED, seeds, phase=phase)
    failed = [r for r in seeds if r.status is RunStatus.FAILED]
    if failed or any(r.status is not RunStatus.SURVIVED for r in seeds):
        reason = (failed[0].error or "failed") if failed else "a seed run ended early"
        return TrialOutcome(number, config, TrialState.FAIL, seeds, reason=reason, phase=phase)
    value = statistics.fmean(r.val_loss for r in seeds if r.val_loss is not None)
    return TrialOutcome(number, config, TrialState.COMPLETE, seeds, value=value, phase=phase)
