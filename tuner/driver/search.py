"""The search driver: Optuna ask/tell over seed runs streamed back by an executor.

A trial is one config on K seeds from the study's seed stream (``tuner.driver.evidence.SeedStream``),
run in parallel; the loop asks, submits, polls and tells, and acts on what the policies decide
(:class:`~tuner.driver.outcome.Decision`): which seeds run first (``tuner.driver.seeding``: with
``--pruner first-seed``, the default, the first seed alone), which trials race on more seeds before
they are told (``tuner.driver.racing``). The pruner (``tuner.driver.pruning``) stops a finite trial
that is behind; one diverged seed makes the trial diverged, its siblings cancelled once past that
step. How a trial ends is decided in one place (``tuner.driver.outcome.judge``; docs/concepts.md),
and written once, as its :class:`~tuner.driver.trialrecord.TrialRecord`.

Only this driver talks to the Optuna storage; callbacks (MLflow tracking, the terminal view) only
listen (``tuner.driver.outcome.Callback``, as optuna-integration's MLflowCallback): the search never
asks one anything back, so a trial's record holds nothing a callback made (its MLflow run is found
by its tags: ``tuner.driver.mlflow_runs``).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from tuner.driver import signals
from tuner.driver.evidence import SeedStream
from tuner.driver.intermediate import Reports
from tuner.driver.liveness import Liveness
from tuner.driver.outcome import Act, Callback, Compute, Decision, Executor, Stop, judge, tell
from tuner.driver.pruning import stop_reason
from tuner.driver.racing import Racing, standing
from tuner.driver.seeding import SeedPolicy, seed_policy
from tuner.driver.trialrecord import ATTR, DUPLICATE_OF, REASON, TrialRecord
from tuner.hooks import flush_held, is_enqueued, windowed_tpe
from tuner.records import Phase, RunRecord, RunSpec, RunStatus, Skip, TrainConfig, TrialOutcome, TrialState
from tuner.spaces import SearchSpace

log = logging.getLogger(__name__)
_MAX_DUPLICATES = 20  # duplicates asked in one launch after which the space counts as exhausted
_FILL_S = 0.1  # seconds of asking after which the loop polls the runs in flight (0.5 s let a wave of trial ends
# hold records back: 200 slots, max lag 2.3-2.8 s against 0.63 s; BENCHMARKS.md, "Asking in shorter bursts")
AHEAD_FROM = 64  # slots from which the loop asks trials ahead while nothing is due (:func:`asks_ahead`)


def asks_ahead(slots: int) -> int:
    """How many trials the loop keeps asked ahead on a cluster of ``slots``: a tenth of them from
    ``AHEAD_FROM`` slots on, none below. Runs of one length end in waves (a cohort started together
    ends together), and a wave's trials ended faster than the loop asked: at 500 slots up to 113
    stood empty while the loop, between waves, waited 39 % of its time (BENCHMARKS.md). A trial asked
    ahead is started at once when a slot frees. On a small cluster it would be asked before results
    TPE could have seen, for no gain: there the loop keeps up."""
    return slots // 10 if slots >= AHEAD_FROM else 0


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
    prune_to: int = 0  # the last step at which it may (0: any step before the last)

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
    stop: Stop | None = None  # why and at which step it was stopped while finite (the pruner, the seed policy)
    deferred: tuple[int, ...] = ()  # seeds that run once the seed policy says so (``--pruner first-seed``)

    def records(self, phase_only: bool = False) -> dict[int, RunRecord]:
        """Final records in seed order (search seeds first): this phase's, or every phase's."""
        done = self.finals if phase_only else {**self.earlier, **self.finals}
        order = self.seeds if phase_only else (*self.earlier, *self.seeds)
        return {s: done[s] for s in order if s in done}


class Search:
    """Runs ``budget.trials`` trials of ``space`` on ``executor`` (see the module docs).

    ``stream`` gives every run its seed; ``seeding`` decides which search seeds run first (default:
    the one the study's pruner carries, ``tuner.driver.seeding.seed_policy``); ``self.racing``
    (``tuner.driver.racing``) which trials earn race seeds; ``ahead`` how many trials the loop keeps
    asked ahead while nothing is due (default: :func:`asks_ahead` of the executor's slots).
    """

    def __init__(self, study: optuna.Study, space: SearchSpace, model: str, executor: Executor, budget: Budget,
                 callbacks: Sequence[Callback] = (), skip: Skip | None = None, stream: SeedStream | None = None,
                 liveness: Liveness | None = None, seeding: SeedPolicy | None = None, ahead: int | None = None) -> None:
        self.study, self.space, self.model = study, space, model
        self.skip = skip or Skip()  # samples the data preflight left out of every run
        self.executor, self.budget, self.callbacks = executor, budget, list(callbacks)
        self.stream = stream or SeedStream(0)
        self._active: dict[int, _Trial] = {}
        self._reports = Reports()  # intermediate values, written in batches (tuner.driver.intermediate)
        self.outcomes: list[TrialOutcome] = []
        self.compute = Compute()
        self.seeding = seeding or seed_policy(study.pruner)
        self.racing = Racing(budget.race_levels(), budget.seeds, standing(study))
        # trial number -> params of the configs earlier launches trained: never trained again
        self._held = {t.number: t.params for t in study.get_trials(deepcopy=False)
                      if t.state.is_finished() and DUPLICATE_OF not in t.user_attrs}
        self.liveness = liveness  # heartbeats and a study shared with other drivers (None: this one alone)
        self._open: tuple[float, int, int] = (0.0, 0, 0)  # (when counted, trials to ask, others' running)
        self.duplicates = 0  # trials asked whose config the study already held (told FAIL, not trained)
        # trials asked ahead (claimed, suggested, written; not started): see asks_ahead
        self.ahead = asks_ahead(getattr(executor, "slots", 0)) if ahead is None else ahead
        self._ready: deque[tuple[optuna.trial.Trial, TrainConfig]] = deque()

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
            deadline = time.monotonic() + _FILL_S
            while self._can_ask(to_ask):
                if self._ready:
                    self._begin(*self._ready.popleft())
                elif self._start_trial():
                    to_ask = self._asked(to_ask)
                if time.monotonic() >= deadline:
                    break  # poll the runs in flight, then ask on
            if not self._active and not self._ready and (to_ask <= 0 or self.duplicates >= _MAX_DUPLICATES):
                if not others:
                    return self.outcomes
                time.sleep(0.5)  # only other drivers' trials are left: wait for them to end or go stale
            can = self._can_ask(to_ask)
            ahead = not can and len(self._ready) < self.ahead and self._may_ask(to_ask)
            records = self.executor.poll(timeout=0.0 if can or ahead else 0.5)
            if ahead and not records:  # nothing due: ask a trial now, to start when a slot frees
                asked = self._ask()
                if asked is not None:
                    self._ready.append(asked)
                    to_ask = self._asked(to_ask)
            for record in records:
                self._on_record(record)
            signals.raise_if_dropped()
            self._reports.flush_due()

    def _can_ask(self, to_ask: int) -> bool:
        """Whether a trial is to be started now: a slot is free, and one is asked ahead or may be asked."""
        return self.executor.free() > 0 and (bool(self._ready) or self._may_ask(to_ask))

    def _may_ask(self, to_ask: int) -> bool:
        """Whether a trial may be asked: one is owed and the space is not exhausted."""
        return to_ask > 0 and self.duplicates < _MAX_DUPLICATES

    def _asked(self, to_ask: int) -> int:
        """Count a trial asked: the trials still owed, here and in the study's count."""
        self._open = (self._open[0], self._open[1] - 1, self._open[2])
        return to_ask - 1

    def _study_open(self) -> tuple[int, int]:
        """(trials to ask, other drivers' running trials), counted in the study at most once a second."""
        when, _, _ = self._open
        if time.monotonic() - when >= 1.0 and self.liveness is not None:
            self._open = (time.monotonic(), *self.liveness.open_trials(self.budget.trials))
        return self._open[1], self._open[2]

    def _start_trial(self) -> bool:
        """Ask a trial and submit its search runs; False if its config was already trained (told FAIL)."""
        asked = self._ask()
        if asked is None:
            return False
        self._begin(*asked)
        return True

    def _ask(self) -> tuple[optuna.trial.Trial, TrainConfig] | None:
        """Ask a trial, claim it, suggest its config and write it; None if the config was already
        trained (the trial told FAIL)."""
        trial = self.study.ask()
        if self.liveness is not None:
            self.liveness.claim(trial)
        config = self.space.suggest(trial)
        flush_held(self.study)  # the trial's parameters and attributes, in one transaction
        twin = self._twin(trial)
        if twin is not None:
            self._skip_duplicate(trial, twin)
            return None
        return trial, config

    def _begin(self, trial: optuna.trial.Trial, config: TrainConfig) -> None:
        """Submit an asked trial's first search runs."""
        seeds = self.stream.search(trial.number, self.budget.seeds)
        first = self.seeding.first(seeds)
        self._active[trial.number] = _Trial(trial, config, first, deferred=seeds[len(first):])
        for cb in self.callbacks:
            cb.on_trial_start(trial.number, config, seeds)
        self._submit(trial.number, config, first, Phase.SEARCH)

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
        trial.set_user_attr(REASON, f"same config as trial {twin}: not trained again")
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
            b = self.budget
            if 0 < b.prune_from <= record.step < b.steps and (not b.prune_to or record.step <= b.prune_to):
                self._reports.show(active.trial)  # the pruner reads the trial's values from its own copy
                if active.trial.should_prune():
                    self._stop(active, record.step)

    def _stop(self, active: _Trial, step: int) -> None:
        """The pruner found this finite trial behind: stop its runs (it is not a divergence)."""
        if not active.cancelled:
            active.cancelled, active.stop = True, Stop(step, stop_reason(self.study.pruner, step))
            self.executor.cancel(active.trial.number)

    def _phase_done(self, active: _Trial) -> None:
        """The runs of the trial's phase ended: judge it, and act on its seed policy's and racing's decisions."""
        number = active.trial.number
        outcome = judge(number, active.config, active.records(), stop=active.stop)
        if active.deferred:
            decision = self.seeding.after_first(outcome, active.stop is not None, self.racing.values())
            if decision.act is Act.RUN:
                self._run_deferred(active)
                return
            active.deferred = ()  # they never run
            if decision.state is TrialState.STOPPED:
                active.stop = Stop(self.budget.steps, decision.reason, ended=True)
                outcome = judge(number, active.config, active.records(), stop=active.stop)
        if active.phase is not Phase.SEARCH:
            part = judge(number, active.config, active.records(phase_only=True), phase=active.phase)
            for cb in self.callbacks:
                cb.on_phase_end(part)
        self._act(active, outcome, self.racing.on_trial_result(outcome))
        for waiting, decision in self.racing.reconsider():
            self._act(self._active[waiting.number], waiting, decision)

    def _run_deferred(self, active: _Trial) -> None:
        deferred, active.deferred = active.deferred, ()
        active.seeds = (*active.seeds, *deferred)
        self._submit(active.trial.number, active.config, deferred, Phase.SEARCH)

    def _act(self, active: _Trial, outcome: TrialOutcome, decision: Decision) -> None:
        """Race the trial to ``decision.seeds``, leave it waiting, or tell it (with the decision's reason)."""
        if decision.act is Act.RUN:
            self._race(active, decision.seeds)
        elif decision.act is Act.TELL:
            self._finish(active, replace(outcome, reason=decision.reason) if decision.reason else outcome)

    def _race(self, active: _Trial, level: int) -> None:
        raced = len(active.earlier) + len(active.finals) - self.budget.seeds
        seeds = self.stream.race(level - self.budget.seeds)[raced:]
        active.earlier.update(active.records(phase_only=True))
        active.finals, active.seeds, active.phase, active.cancelled = {}, seeds, Phase.RACE, False
        active.reached, active.diverged_at = {}, None
        for cb in self.callbacks:
            cb.on_phase_start(active.trial.number, Phase.RACE, active.config, seeds)
        self._submit(active.trial.number, active.config, seeds, Phase.RACE)

    def _finish(self, active: _Trial, outcome: TrialOutcome) -> None:
        number = active.trial.number
        record = TrialRecord.from_outcome(outcome, self.budget.steps, active.stop.step if active.stop else None)
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
            cb.on_trial_complete(outcome, record)

    def _report_values(self, active: _Trial, outcome: TrialOutcome) -> None:
        """Write the trial's values; a diverged trial's end with NaN at its divergence step.

        The NaN goes at the step its earliest seed diverged at (the step its record and MLflow tags
        give): a later seed run (deferred, or a race seed) may diverge before a step the first ones
        reported, so their values from that step on are taken back first (``Reports.retract``; where a
        storage cannot, the NaN goes after them). TPE ranks a pruned trial by its last reported step,
        and Optuna gives a PRUNED trial whose last value is NaN no value, so no training loss is shown
        on the val_loss axis.
        """
        first = outcome.divergence if outcome.state is TrialState.DIVERGED else None
        if first is None:
            self._reports.flush(active.trial)
            return
        kept = self._reports.retract(active.trial, first.step)  # and the rest written
        active.trial.report(float("nan"), first.step if kept is None else kept + 1)


def make_sampler(kind: str, seed: int | None, searched: int, **tpe: Any) -> optuna.samplers.BaseSampler:
    """The study's sampler: ``random``, or ``tpe`` (multivariate, constant liar for parallel trials).

    TPE starts from ``2 x searched`` random trials, between 4 and Optuna's default of 10: on a
    small space ten random trials often find a good config before TPE has had its say. Past
    ``tuner.hooks.TPE_WINDOW`` finished trials it reads the best 25 and the most recent ones only
    (``tuner.hooks.windowed_tpe``), so that an ask does not grow with the study. ``tpe``: more of
    ``TPESampler``'s options (a benchmark's variant).
    """
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    startup = min(10, max(4, 2 * searched))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # ``group`` is experimental
        # group: a nullable knob's value is suggested only when ``use_<name>`` is true (tuner.spaces.Param),
        # and TPE models each set of params that occur together instead of sampling them independently
        return windowed_tpe(seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=startup,
                            **tpe)

