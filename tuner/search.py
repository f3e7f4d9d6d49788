"""The search driver: Optuna ask/tell over seed runs streamed back by an executor.

A trial is one config on K seeds, run in parallel. How a trial ends (see design.md):

- every seed reached the budget: COMPLETE, with the validation loss averaged over seeds;
- a seed went non-finite: the siblings are cancelled at once, the last step reached is reported
  as an intermediate value (TPE ranks pruned trials by it) and the trial is PRUNED;
- a seed failed (model error, or its worker died more than ``max_retries`` times): FAIL.

Only this driver talks to the Optuna storage; callbacks (MLflow tracking, the terminal view) hear
``on_trial_start``, ``on_trial_result`` and ``on_trial_complete``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna

from tuner.records import RunRecord, RunSpec, RunStatus, Skip, TrainConfig, TrialOutcome, TrialState
from tuner.spaces import SearchSpace

_OPTUNA_STATE = {
    TrialState.COMPLETE: optuna.trial.TrialState.COMPLETE,
    TrialState.PRUNED: optuna.trial.TrialState.PRUNED,
    TrialState.FAIL: optuna.trial.TrialState.FAIL,
}


class Executor(Protocol):
    """Runs seed runs somewhere and streams their records back (see tuner.executor)."""

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
    """Hears about trials as they start, report and end (Ray Tune's vocabulary)."""

    def on_trial_start(self, number: int, config: TrainConfig) -> None:
        """A trial was asked and its seed runs submitted."""

    def on_trial_result(self, record: RunRecord) -> None:
        """A seed run streamed a record."""

    def on_trial_complete(self, outcome: TrialOutcome) -> None:
        """A trial ended and was told to Optuna."""


@dataclass(frozen=True)
class Budget:
    """How much a launch trains: trials to finish, steps and seeds per trial."""

    trials: int
    steps: int
    seeds: int = 2
    report_every: int = 25
    threads: int = 1


@dataclass
class _Trial:
    """A trial in flight."""

    trial: optuna.trial.Trial
    config: TrainConfig
    finals: dict[int, RunRecord] = field(default_factory=dict)  # seed -> final record
    losses: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> seed -> loss
    reported: set[int] = field(default_factory=set)
    cancelled: bool = False


class Search:
    """Runs ``budget.trials`` trials of ``space`` on ``executor`` (see the module docs)."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        model: str,
        executor: Executor,
        budget: Budget,
        callbacks: Sequence[Callback] = (),
        run_id: Any = None,
        skip: Skip | None = None,
    ) -> None:
        self.study, self.space, self.model = study, space, model
        self.skip = skip or Skip()  # samples the data preflight left out of every run
        self.executor, self.budget, self.callbacks = executor, budget, list(callbacks)
        self._run_id = run_id  # trial number -> MLflow run id (or None)
        self._active: dict[int, _Trial] = {}
        self.outcomes: list[TrialOutcome] = []

    def run(self, trials: int | None = None) -> list[TrialOutcome]:
        """Ask and finish ``trials`` trials (default: the budget's), then return their outcomes."""
        to_ask = self.budget.trials if trials is None else trials
        while to_ask > 0 or self._active:
            while to_ask > 0 and self.executor.free() > 0:
                self._start_trial()
                to_ask -= 1
            for record in self.executor.poll(timeout=0.5):
                self._on_record(record)
        return self.outcomes

    def _start_trial(self) -> None:
        trial = self.study.ask()
        config = self.space.suggest(trial)
        self._active[trial.number] = _Trial(trial, config)
        for cb in self.callbacks:
            cb.on_trial_start(trial.number, config)
        for seed in range(self.budget.seeds):
            self.executor.submit(
                RunSpec(
                    trial.number, seed, self.model, config, self.budget.steps,
                    self.budget.report_every, self.budget.threads, skip=self.skip,
                )
            )

    def _on_record(self, record: RunRecord) -> None:
        active = self._active.get(record.trial)
        if active is None:
            return
        for cb in self.callbacks:
            cb.on_trial_result(record)
        if record.status in (RunStatus.DIVERGED, RunStatus.FAILED) and not active.cancelled:
            active.cancelled = True  # one unstable seed makes the config unstable: stop the others now
            self.executor.cancel(record.trial)
        if not record.final:
            if record.status is RunStatus.RUNNING:
                self._report_progress(active, record)
            return
        active.finals[record.seed] = record
        if len(active.finals) == self.budget.seeds:
            self._finish(active)

    def _report_progress(self, active: _Trial, record: RunRecord) -> None:
        """Report the mean training loss at a step once every seed has reached it."""
        at_step = active.losses.setdefault(record.step, {})
        at_step[record.seed] = record.loss if record.loss is not None else float("nan")
        if len(at_step) == self.budget.seeds and record.step not in active.reported:
            active.trial.report(statistics.fmean(at_step.values()), record.step)
            active.reported.add(record.step)
            del active.losses[record.step]

    def _finish(self, active: _Trial) -> None:
        outcome = judge(active.trial.number, active.config, active.finals)
        number = active.trial.number
        if outcome.state is TrialState.PRUNED:
            self._report_divergence(active, outcome)
        attrs = trial_attrs(outcome, self._run_id(number) if self._run_id else None)
        for key, value in {**attrs, "steps": self.budget.steps}.items():
            active.trial.set_user_attr(key, value)
        self.study.tell(number, outcome.value, state=_OPTUNA_STATE[outcome.state])
        del self._active[number]
        self.outcomes.append(outcome)
        for cb in self.callbacks:
            cb.on_trial_complete(outcome)

    @staticmethod
    def _report_divergence(active: _Trial, outcome: TrialOutcome) -> None:
        """Report the last finite step, so TPE ranks this trial by how long it survived."""
        first = outcome.divergence
        assert first is not None  # a PRUNED outcome always has a diverged seed
        if first.last_finite_loss is not None and first.steps_survived not in active.reported:
            active.trial.report(first.last_finite_loss, first.steps_survived)


def make_sampler(kind: str, seed: int | None, searched: int) -> optuna.samplers.BaseSampler:
    """The study's sampler: ``random``, or ``tpe`` (multivariate, constant liar for parallel trials).

    TPE starts from ``2 x searched`` random trials, between 4 and Optuna's default of 10: on a
    small space ten random trials often find a good config before TPE has had its say.
    """
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    startup = min(10, max(4, 2 * searched))
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup)


def judge(number: int, config: TrainConfig, finals: dict[int, RunRecord]) -> TrialOutcome:
    """The state of a trial from its seeds' final records: diverged > failed > survived."""
    seeds = tuple(finals[s] for s in sorted(finals))
    if any(r.status is RunStatus.DIVERGED for r in seeds):
        return TrialOutcome(number, config, TrialState.PRUNED, seeds)
    failed = [r for r in seeds if r.status is RunStatus.FAILED]
    if failed or any(r.status is not RunStatus.SURVIVED for r in seeds):
        reason = (failed[0].error or "failed") if failed else "a seed run ended early"
        return TrialOutcome(number, config, TrialState.FAIL, seeds, reason=reason)
    value = statistics.fmean(r.val_loss for r in seeds if r.val_loss is not None)
    return TrialOutcome(number, config, TrialState.COMPLETE, seeds, value=value)


def trial_attrs(outcome: TrialOutcome, run_id: str | None) -> dict[str, Any]:
    """What the Optuna trial keeps about its outcome (read back by export and report)."""
    first = outcome.divergence
    return {
        "config": outcome.config.flat(),
        "status": outcome.state.value,
        "steps_survived": list(outcome.steps_survived),
        "seeds": [r.seed for r in outcome.seeds],
        "val_loss": outcome.value,
        "divergence_step": first.step if first else None,
        "diverged_on": first.diverged_on.value if first and first.diverged_on else None,
        "reason": outcome.reason,
        "mlflow_run_id": run_id,
        "nodes": sorted({str(r.info.get("node_id")) for r in outcome.seeds if r.info.get("node_id")}),
    }
