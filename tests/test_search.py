"""The search loop, driven by an in-process executor whose outcomes are a known function of the config.

The fake executor stands in for Ray only here; the real executor is tested in test_executor.py and
end to end in test_launch.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import optuna
import pytest

from tuner.models import Knob
from tuner.records import DivergedOn, RunRecord, RunSpec, RunStatus, TrialState
from tuner.search import Budget, Search, judge
from tuner.spaces import space_from

KNOBS = {"width": Knob("int", 8, 1, 64)}


def outcome_of(spec: RunSpec) -> tuple[int | None, float]:
    """Known landscape: lr above 1e-2 diverges (sooner when larger); best val loss at lr = 10**-2.5."""
    lr = spec.config.learning_rate
    diverge_at = int(0.5 / lr) + spec.seed if lr > 1e-2 else None
    return diverge_at, (math.log10(lr) + 2.5) ** 2 + 0.01 * spec.seed


class FakeExecutor:
    """Runs each spec instantly in process, streaming its records one poll at a time."""

    def __init__(self, slots: int = 2, fail_trial: int | None = None) -> None:
        self.slots, self.fail_trial = slots, fail_trial
        self.running: dict[tuple[int, int], deque[RunRecord]] = {}
        self.cancelled: list[int] = []
        self.submitted: list[RunSpec] = []
        self.delivered: list[RunRecord] = []
        self.finals_before_cancel: list[RunRecord] = []

    def free(self) -> int:
        return self.slots - len(self.running)

    def submit(self, spec: RunSpec) -> None:
        self.submitted.append(spec)
        self.running[(spec.trial, spec.seed)] = deque(self._records(spec))

    def _records(self, spec: RunSpec) -> list[RunRecord]:
        if spec.trial == self.fail_trial and spec.seed == 0:
            return [RunRecord(spec.trial, 0, 0, RunStatus.FAILED, final=True, error="boom")]
        diverge_at, val = outcome_of(spec)
        end = min(diverge_at or spec.steps + 1, spec.steps + 1)
        out = [
            RunRecord(spec.trial, spec.seed, s, RunStatus.RUNNING, loss=1.0 / s, steps_survived=s)
            for s in range(spec.report_every, end, spec.report_every)
        ]
        if diverge_at is not None and diverge_at <= spec.steps:
            out.append(RunRecord(spec.trial, spec.seed, diverge_at, RunStatus.DIVERGED,
                                 steps_survived=diverge_at - 1, diverged_on=DivergedOn.LOSS))  # the alarm
            out.append(RunRecord(spec.trial, spec.seed, diverge_at, RunStatus.DIVERGED, final=True,
                                 steps_survived=diverge_at - 1, last_finite_loss=0.5,
                                 diverged_on=DivergedOn.LOSS))
        else:
            out.append(RunRecord(spec.trial, spec.seed, spec.steps, RunStatus.SURVIVED, final=True,
                                 steps_survived=spec.steps, val_loss=val))
        return out

    def cancel(self, trial: int) -> None:
        self.cancelled.append(trial)
        self.finals_before_cancel = [r for r in self.delivered if r.final and r.trial == trial]
        for key in [k for k in self.running if k[0] == trial]:
            last = self.running[key][0]
            if last.status is RunStatus.DIVERGED:  # as the real executor: the diverged run finishes
                continue
            self.running[key] = deque([replace(last, status=RunStatus.CANCELLED, final=True)])

    def poll(self, timeout: float) -> list[RunRecord]:
        out = []
        for key in list(self.running):
            record = self.running[key].popleft()
            out.append(record)
            self.delivered.append(record)
            if record.final:
                del self.running[key]
        return out


def make_search(trials: int, executor: FakeExecutor, sampler: optuna.samplers.BaseSampler) -> Search:
    params = {"learning_rate": {"low": 1e-5, "high": 1.0, "log": True}}
    space = space_from(params, "fake", KNOBS, "<test>")
    study = optuna.create_study(direction="minimize", sampler=sampler)
    return Search(study, space, "fake", executor, Budget(trials, steps=200, seeds=2, report_every=20))


def test_search_seeded_tpe_finds_the_known_best() -> None:
    search = make_search(40, FakeExecutor(), optuna.samplers.TPESampler(seed=1, multivariate=True))
    search.run()
    best = search.study.best_trial
    assert abs(math.log10(best.params["learning_rate"]) + 2.5) < 0.35
    assert len(search.study.trials) == 40


def test_search_diverged_seed_prunes_trial_and_cancels_siblings() -> None:
    executor = FakeExecutor()
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 0.1})
    (outcome,) = search.run()
    trial = search.study.trials[0]
    assert outcome.state is TrialState.PRUNED and trial.state == optuna.trial.TrialState.PRUNED
    assert executor.cancelled == [0]
    assert executor.finals_before_cancel == []  # cancelled on the divergence alarm, not the final record
    assert outcome.divergence is not None and outcome.divergence.step == 5  # int(0.5 / 0.1) + seed 0
    assert trial.user_attrs["divergence_step"] == 5
    assert trial.user_attrs["diverged_on"] == "loss"


def test_search_survivor_is_complete_with_mean_val_loss() -> None:
    search = make_search(1, FakeExecutor(), optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 10**-2.5})
    (outcome,) = search.run()
    assert outcome.state is TrialState.COMPLETE
    assert outcome.value == pytest.approx(0.005)  # mean of 0.00 and 0.01 over the two seeds
    trial = search.study.trials[0]
    assert trial.user_attrs["steps_survived"] == [200, 200]
    assert sorted(trial.intermediate_values) == list(range(20, 201, 20))


def test_search_pruned_trial_reports_last_step_it_reached() -> None:
    search = make_search(1, FakeExecutor(), optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 0.005 / 0.8 * 10})  # diverges at 80 on seed 0
    search.run()
    trial = search.study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert max(trial.intermediate_values) == trial.user_attrs["divergence_step"] - 1


def test_search_failed_seed_fails_trial_with_reason_and_goes_on() -> None:
    search = make_search(3, FakeExecutor(fail_trial=1), optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        search.study.enqueue_trial({"learning_rate": 1e-3})
    outcomes = search.run()
    states = {o.number: o.state for o in outcomes}
    assert states[1] is TrialState.FAIL
    assert search.study.trials[1].state == optuna.trial.TrialState.FAIL
    assert search.study.trials[1].user_attrs["reason"] == "boom"
    assert len(outcomes) == 3 and all(t.state.is_finished() for t in search.study.trials)


def test_search_runs_seeds_of_a_trial_in_parallel() -> None:
    executor = FakeExecutor(slots=2)
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0))
    search.run()
    assert [(s.trial, s.seed) for s in executor.submitted] == [(0, 0), (0, 1)]


def test_judge_divergence_beats_failure() -> None:
    diverged = RunRecord(0, 0, 7, RunStatus.DIVERGED, final=True, steps_survived=6)
    failed = RunRecord(0, 1, 0, RunStatus.FAILED, final=True, error="x")
    outcome = judge(0, space_from({}, "fake", KNOBS, "<t>").config(
        {"learning_rate": 1.0, "clip_norm": None, "l2_weight": 0.0, "lr_decay": 1.0, "width": 8}),
        {0: diverged, 1: failed})
    assert outcome.state is TrialState.PRUNED


def test_make_sampler_tpe_starts_from_two_random_trials_per_searched_knob_between_4_and_10() -> None:
    from tuner.search import make_sampler

    startups = [make_sampler("tpe", 0, n)._n_startup_trials for n in (1, 2, 3, 8)]
    assert startups == [4, 4, 6, 10]
    assert isinstance(make_sampler("random", 0, 2), optuna.samplers.RandomSampler)
