"""The search loop, driven by an in-process executor whose outcomes are a known function of the config.

The fake executor stands in for Ray only here; the real executor is tested in test_executor.py and
end to end in test_launch.py.
"""

from __future__ import annotations

import inspect
import math
import re
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.storages import RDBStorage

from tuner import hooks
from tuner.driver import search as search_module
from tuner.driver.evidence import SeedStream
from tuner.driver.outcome import Callback, judge
from tuner.driver.pruning import make_pruner, prune_start
from tuner.driver.racing import RACE_Z
from tuner.driver.search import Budget, Search
from tuner.driver.trialrecord import ATTR, SeedStatus, read
from tuner.models import Knob
from tuner.records import DivergedOn, RunRecord, RunSpec, RunStatus, TrialState
from tuner.spaces import space_from

KNOBS = {"width": Knob("int", 8, 1, 64)}


INIT_LOSS = 5.0  # every fake run's validation loss at initialisation


def outcome_of(spec: RunSpec, bad_seeds: frozenset[int] = frozenset()) -> tuple[int | None, float]:
    """Known landscape: lr above 1e-2 diverges (sooner when larger); best val loss at lr = 10**-2.5.

    Between 10**-2.7 and 10**-2.3 a config is fragile: it diverges at step 150 on ``bad_seeds``.
    """
    lr = spec.config.learning_rate
    noise = 0.01 * (spec.seed % 2)
    diverge_at = int(0.5 / lr) + spec.seed % 2 if lr > 1e-2 else None
    if spec.seed in bad_seeds and 10**-2.7 < lr < 10**-2.3:
        diverge_at = 150
    return diverge_at, (math.log10(lr) + 2.5) ** 2 + noise


class FakeExecutor:
    """Runs each spec instantly in process, streaming its records one poll at a time."""

    def __init__(self, slots: int = 2, fail_trial: int | None = None, bad_seeds: frozenset[int] = frozenset(),
                 slow: frozenset[int] = frozenset(), at: dict[int, int] | None = None) -> None:
        self.slots, self.fail_trial, self.bad_seeds = slots, fail_trial, bad_seeds
        self.at = at or {}  # seed -> the step it diverges at, whatever the config
        self.slow = slow  # seeds whose records come one poll in three (a slower worker)
        self.polls = 0
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
        if spec.trial == self.fail_trial and spec.seed == spec_seeds(spec.trial)[0]:
            return [RunRecord(spec.trial, spec.seed, 0, RunStatus.FAILED, final=True, error="boom")]
        diverge_at, val = outcome_of(spec, self.bad_seeds)
        diverge_at = self.at.get(spec.seed, diverge_at)
        end = min(diverge_at or spec.steps + 1, spec.steps + 1)
        out = [
            RunRecord(spec.trial, spec.seed, s, RunStatus.RUNNING, loss=val + 1.0 / s, steps_survived=s,
                      phase=spec.phase)
            for s in range(spec.report_every, end, spec.report_every)
        ]
        if diverge_at is not None and diverge_at <= spec.steps:
            out.append(RunRecord(spec.trial, spec.seed, diverge_at, RunStatus.DIVERGED,
                                 steps_survived=diverge_at - 1, diverged_on=DivergedOn.LOSS,
                                 phase=spec.phase))  # the alarm
            out.append(RunRecord(spec.trial, spec.seed, diverge_at, RunStatus.DIVERGED, final=True,
                                 steps_survived=diverge_at - 1, last_finite_loss=0.5,
                                 diverged_on=DivergedOn.LOSS, phase=spec.phase, init_val_loss=INIT_LOSS))
        else:
            out.append(RunRecord(spec.trial, spec.seed, spec.steps, RunStatus.SURVIVED, final=True,
                                 steps_survived=spec.steps, val_loss=val, phase=spec.phase,
                                 init_val_loss=INIT_LOSS))
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
        self.polls += 1
        for key in list(self.running):
            if key[1] in self.slow and self.polls % 3:
                continue
            record = self.running[key].popleft()
            out.append(record)
            self.delivered.append(record)
            if record.final:
                del self.running[key]
        return out


STREAM = SeedStream(7)


def spec_seeds(trial: int) -> tuple[int, ...]:
    """The search seeds a trial of these tests gets."""
    return STREAM.search(trial, 2)


def make_search(trials: int, executor: FakeExecutor, sampler: optuna.samplers.BaseSampler,
                race_seeds: int = 0, pruner: str = "none", callbacks: Sequence[Callback] = (),
                storage: str | optuna.storages.BaseStorage | None = None) -> Search:
    params = {"learning_rate": {"low": 1e-5, "high": 1.0, "log": True}}
    space = space_from(params, "fake", KNOBS, "<test>")
    study = optuna.create_study(direction="minimize", sampler=sampler, pruner=make_pruner(pruner, 200),
                                storage=storage)
    budget = Budget(trials, steps=200, seeds=2, report_every=20, race_seeds=race_seeds,
                    prune_from=prune_start(pruner, 200))
    return Search(study, space, "fake", executor, budget, callbacks, stream=STREAM)


def test_search_seeded_tpe_finds_the_known_best() -> None:
    search = make_search(40, FakeExecutor(), optuna.samplers.TPESampler(seed=1, multivariate=True))
    search.run()
    best = search.study.best_trial
    assert abs(math.log10(best.params["learning_rate"]) + 2.5) < 0.35
    assert len(search.study.trials) == 40


HOOKS = frozenset(name for name in vars(Callback) if name.startswith("on_"))


class Listener:
    """A callback that only listens: it notes each hook it hears (called as the Callback protocol
    declares it) and fails on any other attribute the search might ask it for (a run id, say)."""

    def __init__(self, heard: list[tuple[str, int]]) -> None:
        object.__setattr__(self, "heard", heard)

    def __getattribute__(self, name: str) -> object:
        if name not in HOOKS:
            raise AssertionError(f"the search asked its callback for {name!r}: a callback only listens")
        heard: list[tuple[str, int]] = object.__getattribute__(self, "heard")

        def hook(*args: object, **kwargs: object) -> None:
            inspect.signature(getattr(Callback, name)).bind(self, *args, **kwargs)
            first = args[0]
            heard.append((name, first if isinstance(first, int) else getattr(first, "trial", None)
                          or getattr(first, "number", 0)))

        return hook


def test_search_runs_without_a_tracker_and_only_calls_a_callback_through_its_hooks() -> None:
    """Two trials, the best raced 2 -> 4 -> 8 seeds: the same records with no callback as with a
    listener, none holding an MLflow run id; the listener heard every trial start, report and end."""
    studies, heard = [], []
    for callbacks in ((), (Listener(heard),)):
        search = make_search(2, FakeExecutor(), optuna.samplers.RandomSampler(seed=0), race_seeds=8,
                             callbacks=callbacks)
        search.study.enqueue_trial({"learning_rate": 10**-2.5})
        search.study.enqueue_trial({"learning_rate": 0.1})
        search.run()
        studies.append(search.study)
    alone, listened = ([read(t) for t in study.trials] for study in studies)
    assert alone == listened and [r.state for r in alone] == [TrialState.SURVIVED, TrialState.DIVERGED]
    assert all(r is not None and r.run_id is None and "run_id" not in t.user_attrs[ATTR]
               for r, t in zip(alone, studies[0].trials, strict=True))
    for number in (0, 1):
        hooks = [name for name, n in heard if n == number]
        assert hooks[0] == "on_trial_start" and hooks[-1] == "on_trial_complete" and "on_trial_result" in hooks
    raced = [name for name, n in heard if n == 0 and name.startswith("on_phase")]
    assert raced == ["on_phase_start", "on_phase_end"] * 2  # race levels 4 and 8


def test_search_diverged_seed_prunes_trial_and_cancels_siblings() -> None:
    executor = FakeExecutor()
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 0.1})
    (outcome,) = search.run()
    trial = search.study.trials[0]
    assert outcome.state is TrialState.DIVERGED and trial.state == optuna.trial.TrialState.PRUNED
    assert executor.cancelled == [0]
    assert executor.finals_before_cancel == []  # cancelled on the divergence alarm, not the final record
    first_step = min(5 + seed % 2 for seed in spec_seeds(0))  # int(0.5 / 0.1) + seed % 2
    assert outcome.divergence is not None and outcome.divergence.step == first_step
    assert read(trial).divergence_step == first_step
    assert read(trial).diverged_on == "loss"


def test_search_survivor_is_complete_with_mean_val_loss() -> None:
    search = make_search(1, FakeExecutor(), optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 10**-2.5})
    (outcome,) = search.run()
    assert outcome.state is TrialState.SURVIVED
    assert outcome.value == pytest.approx(statistics.fmean(0.01 * (s % 2) for s in spec_seeds(0)))
    trial = search.study.trials[0]
    assert read(trial).steps_survived == (200, 200)
    assert sorted(trial.intermediate_values) == list(range(20, 201, 20))


def test_search_diverged_trial_reports_nan_at_its_divergence_step_and_has_no_value() -> None:
    search = make_search(1, FakeExecutor(), optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 0.005 / 0.8 * 10})  # diverges at 80 or 81
    search.run()
    trial = search.study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    step, value = max(trial.intermediate_values.items())
    assert step == read(trial).divergence_step and math.isnan(value)  # TPE ranks it by that step
    assert all(math.isfinite(v) for s, v in trial.intermediate_values.items() if s < step)
    assert trial.value is None  # no training loss shown on the val_loss axis


def test_search_failed_seed_fails_trial_with_reason_and_goes_on() -> None:
    search = make_search(3, FakeExecutor(fail_trial=1), optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        search.study.enqueue_trial({"learning_rate": 1e-3})
    outcomes = search.run()
    states = {o.number: o.state for o in outcomes}
    assert states[1] is TrialState.FAILED
    assert search.study.trials[1].state == optuna.trial.TrialState.FAIL
    assert read(search.study.trials[1]).reason == "boom"
    assert len(outcomes) == 3 and all(t.state.is_finished() for t in search.study.trials)


def test_search_runs_seeds_of_a_trial_in_parallel() -> None:
    executor = FakeExecutor(slots=2)
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0))
    search.run()
    assert [(s.trial, s.seed) for s in executor.submitted] == [(0, seed) for seed in spec_seeds(0)]


def test_judge_divergence_beats_failure() -> None:
    diverged = RunRecord(0, 0, 7, RunStatus.DIVERGED, final=True, steps_survived=6)
    failed = RunRecord(0, 1, 0, RunStatus.FAILED, final=True, error="x")
    outcome = judge(0, space_from({}, "fake", KNOBS, "<t>").config(
        {"learning_rate": 1.0, "clip_norm": None, "l2_weight": 0.0, "lr_decay": 1.0, "width": 8}),
        {0: diverged, 1: failed})
    assert outcome.state is TrialState.DIVERGED


def test_make_sampler_tpe_starts_from_two_random_trials_per_searched_knob_between_4_and_10() -> None:
    from tuner.driver.search import make_sampler

    startups = [make_sampler("tpe", 0, n)._n_startup_trials for n in (1, 2, 3, 8)]
    assert startups == [4, 4, 6, 10]
    assert isinstance(make_sampler("random", 0, 2), optuna.samplers.RandomSampler)


def test_search_races_a_new_best_to_eight_shared_seeds_before_telling_it() -> None:
    executor = FakeExecutor()
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0), race_seeds=8)
    search.study.enqueue_trial({"learning_rate": 10**-2.5})
    (outcome,) = search.run()
    trial = search.study.trials[0]
    assert outcome.state is TrialState.SURVIVED and trial.state == optuna.trial.TrialState.COMPLETE
    assert read(trial).seed_numbers == (*spec_seeds(0), *STREAM.race(6))  # 2 -> 4 -> 8
    assert read(trial).phases == ("search",) * 2 + ("race",) * 6
    assert search.compute.runs == {"search": 2, "race": 6}
    assert trial.value == pytest.approx(statistics.fmean(0.01 * (s % 2) for s in read(trial).seed_numbers))


def test_search_race_seed_divergence_prunes_the_trial_and_tpe_is_told() -> None:
    bad = frozenset({STREAM.race(2)[1]})  # the second race seed breaks fragile configs
    search = make_search(1, FakeExecutor(bad_seeds=bad), optuna.samplers.RandomSampler(seed=0), race_seeds=8)
    search.study.enqueue_trial({"learning_rate": 10**-2.5})
    (outcome,) = search.run()
    trial = search.study.trials[0]
    assert outcome.state is TrialState.DIVERGED and trial.state == optuna.trial.TrialState.PRUNED
    assert outcome.divergence is not None and outcome.divergence.seed in bad and outcome.divergence.step == 150
    assert read(trial).divergence_step == 150
    assert search.compute.runs["race"] == 2  # it never got to the 4 seeds of the last level
    step, value = max(trial.intermediate_values.items())  # the search seeds reported up to 200
    assert step == 150 and math.isnan(value) and trial.value is None  # Optuna, record and tags: one step
    assert sorted(trial.intermediate_values) == [*range(20, 150, 20), 150]


def test_search_races_only_a_trial_that_could_become_the_best() -> None:
    executor = FakeExecutor()
    search = make_search(2, executor, optuna.samplers.RandomSampler(seed=0), race_seeds=4)
    search.study.enqueue_trial({"learning_rate": 10**-2.5})  # the best: raced to 4 seeds
    search.study.enqueue_trial({"learning_rate": 1e-4})  # worse than the incumbent: not raced
    executor.slots = 2  # one trial at a time, so the first is the incumbent when the second ends
    search.run()
    first, second = search.study.trials
    assert len(read(first).seeds) == 4 and len(read(second).seeds) == 2
    assert second.state == optuna.trial.TrialState.COMPLETE


def test_search_survivor_that_did_not_learn_is_recorded_and_never_raced() -> None:
    search = make_search(1, FakeExecutor(), optuna.samplers.RandomSampler(seed=0), race_seeds=8)
    search.study.enqueue_trial({"learning_rate": 1e-5})  # val loss 6.25, above the 5.0 at init
    (outcome,) = search.run()
    trial = search.study.trials[0]
    assert outcome.state is TrialState.SURVIVED and outcome.learned is False
    assert read(trial).learned is False and read(trial).init_val_loss == INIT_LOSS
    assert len(read(trial).seeds) == 2


def test_budget_race_levels_double_from_the_search_seeds() -> None:
    assert Budget(1, 10, seeds=2, race_seeds=8).race_levels() == (4, 8)
    assert Budget(1, 10, seeds=3, race_seeds=8).race_levels() == (6, 8)
    assert Budget(1, 10, seeds=2, race_seeds=2).race_levels() == ()
    assert Budget(1, 10, seeds=2, race_seeds=0).race_levels() == ()


def test_search_trial_behind_a_racing_trial_waits_and_races_once_that_one_falls_out() -> None:
    bad = frozenset(STREAM.race(2)[:1])  # the fragile leader diverges on the first race seed
    search = make_search(2, FakeExecutor(slots=4, bad_seeds=bad), optuna.samplers.RandomSampler(seed=0),
                         race_seeds=4)
    search.study.enqueue_trial({"learning_rate": 10**-2.5})  # fragile, best loss
    search.study.enqueue_trial({"learning_rate": 10**-2.2})  # sturdy, second best
    search.run()
    leader, second = search.study.trials
    assert leader.state == optuna.trial.TrialState.PRUNED
    assert second.state == optuna.trial.TrialState.COMPLETE and len(read(second).seeds) == 4


def test_search_median_pruner_stops_a_finite_trial_behind_and_never_calls_it_diverged() -> None:
    executor = FakeExecutor(slots=2)  # one trial at a time: five complete before the sixth runs
    search = make_search(7, executor, optuna.samplers.RandomSampler(seed=0), pruner="median")
    for lr in [10**-2.5, 10**-2.4, 10**-2.6, 10**-2.5, 10**-2.45, 1e-5, 10**-2.5]:
        search.study.enqueue_trial({"learning_rate": lr})
    outcomes = {o.number: o for o in search.run()}
    behind = search.study.trials[5]
    assert outcomes[5].state is TrialState.STOPPED and behind.state == optuna.trial.TrialState.PRUNED
    assert read(behind).state is TrialState.STOPPED and read(behind).divergence_step is None
    assert "at step 100 its loss was behind" in read(behind).reason
    assert {s.status for s in read(behind).seeds} == {SeedStatus.CANCELLED}
    assert max(behind.intermediate_values) == 100  # stopped at half the steps, not before
    assert [outcomes[n].state for n in (0, 1, 2, 3, 4, 6)] == [TrialState.SURVIVED] * 6


def test_search_asha_stops_trials_outside_the_best_third_at_a_rung_and_never_calls_them_diverged() -> None:
    executor = FakeExecutor(slots=2)  # one trial at a time: each meets the earlier ones at the rung
    search = make_search(4, executor, optuna.samplers.RandomSampler(seed=0), pruner="asha")  # rungs: 50, 150
    for lr in [10**-2.45, 1e-5, 10**-2.5, 10**-4]:
        search.study.enqueue_trial({"learning_rate": lr})
    outcomes = {o.number: o for o in search.run()}
    assert [outcomes[n].state for n in range(4)] == [
        TrialState.SURVIVED, TrialState.STOPPED, TrialState.SURVIVED, TrialState.STOPPED]
    behind = search.study.trials[1]
    assert behind.state == optuna.trial.TrialState.PRUNED and read(behind).divergence_step is None
    assert "at step 60 its loss was not in the best third" in read(behind).reason
    assert max(behind.intermediate_values) == 60  # the first report at or past the rung (step 50), not before


def test_search_races_a_challenger_past_a_raced_incumbent_only_when_better_by_more_than_the_seed_noise() -> None:
    def val(lr: float, seeds: Sequence[int]) -> float:  # outcome_of's mean validation loss
        return statistics.fmean((math.log10(lr) + 2.5) ** 2 + 0.01 * (s % 2) for s in seeds)

    incumbent, seeds = 10**-2.2, (*spec_seeds(0), *STREAM.race(6))
    spread = statistics.stdev((math.log10(incumbent) + 2.5) ** 2 + 0.01 * (s % 2) for s in seeds)
    noise = RACE_Z * spread * (1 / 2 + 1 / 8) ** 0.5
    grid = [10 ** (-2.2 - i / 1000) for i in range(1, 300)]
    close = next(lr for lr in grid if 0 < val(incumbent, seeds) - val(lr, spec_seeds(1)) < noise / 2)
    clear = next(lr for lr in grid if val(incumbent, seeds) - val(lr, spec_seeds(2)) > 2 * noise)
    assert val(clear, spec_seeds(2)) < val(close, spec_seeds(1))
    search = make_search(3, FakeExecutor(), optuna.samplers.RandomSampler(seed=0), race_seeds=8)
    for lr in (incumbent, close, clear):
        search.study.enqueue_trial({"learning_rate": lr})
    search.run()
    raced = [len(read(t).seeds) for t in search.study.trials]
    assert raced == [8, 2, 8]  # the close challenger is better on its two seeds, but within the noise
    said = [read(t).reason for t in search.study.trials]  # why it was not raced, in its record (issue 28)
    assert said[0] == said[2] == "" and re.fullmatch(
        r"0\.\d+ on 2 seeds is within 1 standard error of trial [02]'s 0\.\d+ on 8 seeds; not raced", said[1])


def test_search_a_slower_seed_that_diverges_first_still_records_the_earliest_divergence() -> None:
    late, early = spec_seeds(0)
    executor = FakeExecutor(slow=frozenset({early}), at={late: 60, early: 30})  # early: a third of the speed
    search = make_search(1, executor, optuna.samplers.RandomSampler(seed=0))
    search.study.enqueue_trial({"learning_rate": 10**-2.5})
    (outcome,) = search.run()
    assert outcome.divergence is not None and (outcome.divergence.seed, outcome.divergence.step) == (early, 30)
    assert read(search.study.trials[0]).divergence_step == 30


@pytest.mark.parametrize("storage", ["memory", "sqlite"])  # sqlite: the values go in batches (intermediate.py)
def test_search_behind_pruner_stops_a_trial_far_behind_the_best_only_once_three_trials_finished(
        tmp_path: Path, storage: str) -> None:
    executor = FakeExecutor(slots=2)  # one trial at a time: each meets the finished ones
    search = make_search(6, executor, optuna.samplers.RandomSampler(seed=0), pruner="behind",  # from step 50
                         storage=f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None)
    for lr in [10**-2.5, 1e-5, 10**-2.45, 10**-2.55, 1e-5, 10**-2.52]:
        search.study.enqueue_trial({"learning_rate": lr})
    outcomes = {o.number: o for o in search.run()}
    assert [outcomes[n].state for n in range(6)] == [TrialState.SURVIVED] * 4 + [
        TrialState.STOPPED, TrialState.SURVIVED]  # trial 1: one finished trial to compare with, too few
    behind = search.study.trials[4]
    assert behind.state == optuna.trial.TrialState.PRUNED and read(behind).divergence_step is None
    assert "at step 60 its loss was more than 1.5x the lowest loss a finished trial had" in read(behind).reason
    assert max(behind.intermediate_values) == 60  # the first report at or past a quarter of the steps


def test_search_on_the_drivers_storage_stores_what_optunas_own_storage_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's storage writes a trial's last values with its end (tuner.hooks.hold_intermediate_values):
    survived, stopped and diverged trials (one diverging on its second seed before a step its first
    reported: its values from there taken back) end in the database as through Optuna's own storage."""
    lrs = [10**-2.5, 1e-5, 10**-2.45, 10**-2.55, 1e-5, 10**-2.52, 0.02, 10**-2.6]
    stored, batches = [], []
    insert = hooks.trials._insert_rows
    monkeypatch.setattr(hooks.trials, "_insert_rows", lambda *a: batches.append(1) or insert(*a))
    for name, wrap in (("own", lambda url: url), ("driver", lambda url: hooks.driver_storage(RDBStorage(url)))):
        url = f"sqlite:///{tmp_path / name}.db"
        executor = FakeExecutor(slots=2, at={spec_seeds(7)[1]: 70})
        search = make_search(len(lrs), executor, optuna.samplers.RandomSampler(seed=0), pruner="behind",
                             storage=wrap(url))
        assert (type(search.study._storage).__name__ == "DriverStorage") == (name == "driver")
        monkeypatch.setattr(search._reports, "flush_due", lambda: None)  # (progress only: time-dependent)
        batches.clear()
        for lr in lrs:
            search.study.enqueue_trial({"learning_rate": lr})
        outcomes = {o.number: o.state for o in search.run()}
        assert {TrialState.SURVIVED, TrialState.STOPPED, TrialState.DIVERGED} <= set(outcomes.values())
        fresh = optuna.load_study(study_name=search.study.study_name, storage=url).trials
        stored.append([(t.state, t.value, str(t.intermediate_values), t.user_attrs[ATTR]["state"]) for t in fresh])
        assert stored[-1] == [(t.state, t.value, str(t.intermediate_values), t.user_attrs[ATTR]["state"])
                              for t in search.study.get_trials()]  # the driver's view is the database's
        assert len(batches) >= len(lrs) if name == "own" else not batches  # with the trial's end instead
    assert stored[0] == stored[1]
    diverged = stored[1][7]
    assert diverged[0] == optuna.trial.TrialState.PRUNED and diverged[2].endswith("70: nan}")


def first_seed_search(pruner: optuna.pruners.BasePruner, lrs: Sequence[float]) -> tuple[Search, FakeExecutor]:
    """A search of ``lrs`` (in order) with ``pruner``, one run at a time (each trial meets the finished ones)."""
    executor = FakeExecutor(slots=1)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0), pruner=pruner)
    space = space_from({"learning_rate": {"low": 1e-5, "high": 1.0, "log": True}}, "fake", KNOBS, "<test>")
    budget = Budget(len(lrs), steps=200, seeds=2, report_every=20, prune_from=prune_start("first-seed", 200))
    for lr in lrs:
        study.enqueue_trial({"learning_rate": lr})
    return Search(study, space, "fake", executor, budget, stream=STREAM), executor


# validation losses 0.16, 0.16, 0.144 (+0.01 on odd seeds): the best trial's is at most 0.154, 1.2x that 0.185
THREE_FINISHED = [10**-2.9, 10**-2.1, 10**-2.12]


def test_first_seed_pruner_runs_the_other_seeds_only_for_a_first_seed_within_1_2x_of_the_best_trial() -> None:
    from tuner.driver.pruning import FirstSeedPruner

    lrs = [*THREE_FINISHED, 10**-3.5, 10**-2.15, 10**-2.95]  # validation losses 1.0, 0.1225, 0.2025 (+0.01)
    search, executor = first_seed_search(FirstSeedPruner(min_step=40, max_step=100, factor=100.0), lrs)
    outcomes = {o.number: o for o in search.run()}
    assert [outcomes[n].state for n in range(6)] == [TrialState.SURVIVED] * 3 + [
        TrialState.STOPPED, TrialState.SURVIVED, TrialState.STOPPED]  # 5: above 1.2x trial 4's, the best now
    ran = {n: [s.seed for s in executor.submitted if s.trial == n] for n in range(6)}
    assert all(ran[n] == list(spec_seeds(n)) for n in (0, 1, 2, 4))
    assert all(ran[n] == list(spec_seeds(n)[:1]) for n in (3, 5))  # the other seed never ran
    stopped = read(search.study.trials[3])
    assert search.study.trials[3].state == optuna.trial.TrialState.PRUNED and stopped.divergence_step is None
    assert stopped.value is None and stopped.steps_survived == (200,) and stopped.stopped_at == 200
    assert stopped.reason.startswith("its first seed's validation loss 1")  # 1 or 1.01, by the seed
    assert "was more than 1.2x the best trial's 0.1444; its other seeds were not run" in stopped.reason
    # the trial's reported values are its first seed's (the seed run alone): what the next trials meet
    first = spec_seeds(4)[0]
    assert search.study.trials[4].intermediate_values[20] == pytest.approx(outcome_of(
        RunSpec(4, first, "fake", outcomes[4].config, 200, 20), frozenset())[1] + 1.0 / 20)


def test_first_seed_pruner_stops_a_first_seed_far_behind_at_the_same_step_and_a_diverged_one_ends_the_trial() -> None:
    lrs = [*THREE_FINISHED, 10**-3.5, 0.05]  # 3: loss 1.0 + 1/s against at most 0.154 + 1/s; 4: diverges at 10
    search, executor = first_seed_search(make_pruner("first-seed", 200), lrs)  # from step 33 to 100, 3x
    outcomes = {o.number: o for o in search.run()}
    assert [outcomes[n].state for n in range(5)] == [TrialState.SURVIVED] * 3 + [TrialState.STOPPED,
                                                                              TrialState.DIVERGED]
    assert [s.trial for s in executor.submitted].count(3) == 1 and [s.trial for s in executor.submitted].count(4) == 1
    stopped = read(search.study.trials[3])
    assert stopped.stopped_at == 40 and max(search.study.trials[3].intermediate_values) == 40  # first report past 33
    assert "at step 40 its first seed's loss was more than 3x the lowest loss a finished trial's first seed had" in \
        stopped.reason
    diverged = read(search.study.trials[4])
    assert diverged.state is TrialState.DIVERGED and diverged.divergence_step in (10, 11) and len(diverged.seeds) == 1


@pytest.mark.parametrize("storage", ["memory", "sqlite"])  # the values written are taken back in each
def test_first_seed_pruner_a_later_seed_diverging_before_the_first_seeds_last_report_is_told_at_its_step(
        tmp_path: Path, storage: str) -> None:
    """The first seed survives all 200 steps (reported every 20); the second diverges at 130: Optuna's
    NaN is at 130, the step the record (and so MLflow's tags) give, and the trial has no value."""
    from tuner.driver.pruning import FirstSeedPruner

    executor = FakeExecutor(slots=1, at={spec_seeds(3)[1]: 130})
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=FirstSeedPruner(min_step=40, max_step=100),
                                storage=f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None)
    space = space_from({"learning_rate": {"low": 1e-5, "high": 1.0, "log": True}}, "fake", KNOBS, "<test>")
    for lr in [*THREE_FINISHED, 10**-2.5]:
        study.enqueue_trial({"learning_rate": lr})
    budget = Budget(4, steps=200, seeds=2, report_every=20, prune_from=40)
    outcomes = {o.number: o for o in Search(study, space, "fake", executor, budget, stream=STREAM).run()}
    assert outcomes[3].state is TrialState.DIVERGED
    assert max(study.trials[2].intermediate_values) == 200  # a survivor keeps its values
    trial = study.trials[3]
    assert read(trial).divergence_step == 130 and read(trial).steps_survived == (200, 129)
    step, value = max(trial.intermediate_values.items())
    assert step == 130 and math.isnan(value) and trial.value is None
    assert sorted(trial.intermediate_values) == [*range(20, 130, 20), 130]


def test_behind_pruner_compares_finished_trials_at_the_same_step_from_its_first_step_to_its_last() -> None:
    from tuner.driver.pruning import BehindBestPruner

    study = optuna.create_study(pruner=BehindBestPruner(min_step=50, max_step=100))
    for final in (1.0, 2.0, 3.0):  # finished trials: 1.0 is the best at step 50 (and at 125)
        t = study.ask()
        t.report(final, 50)
        t.report(final, 125)
        study.tell(t, final)
    late = study.ask()
    late.report(9.0, 125)
    assert not late.should_prune()  # past max_step: the loss there is mostly batch noise
    t = study.ask()
    t.report(100.0, 25)
    assert not t.should_prune()  # before min_step
    t.report(1.6, 50)
    assert t.should_prune()  # above 1.5 x 1.0
    t2 = study.ask()
    t2.report(1.4, 50)
    assert not t2.should_prune()
    t2.report(float("nan"), 75)
    assert not t2.should_prune()  # a divergence is not the pruner's
    t2.report(9.0, 100)  # a step no finished trial reached: nothing to compare with
    assert not t2.should_prune()


def test_search_polls_the_runs_in_flight_while_it_fills_a_large_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filling many slots takes many asks: the loop polls the runs already started at least every
    ``_FILL_S`` seconds instead of after the last ask (here 0 s: a poll after every trial asked)."""
    monkeypatch.setattr(search_module, "_FILL_S", 0.0)
    executor = FakeExecutor(slots=20)
    polled_at: list[int] = []
    real_poll = executor.poll

    def poll(timeout: float) -> list[RunRecord]:
        polled_at.append(len(executor.submitted))
        return real_poll(timeout)

    monkeypatch.setattr(executor, "poll", poll)
    make_search(10, executor, optuna.samplers.RandomSampler(seed=0)).run()
    assert polled_at[:3] == [2, 4, 6]  # one trial (2 seed runs) asked between two polls while slots were free
    assert len(executor.submitted) == 20


def test_the_pruner_is_asked_only_between_its_first_and_last_step() -> None:
    from tuner.driver.pruning import FirstSeedPruner, prune_end

    asked: list[int] = []

    class Counting(FirstSeedPruner):
        def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
            asked.append(int(trial.last_step or 0))
            return super().prune(study, trial)

    search, _ = first_seed_search(Counting(min_step=40, max_step=100), THREE_FINISHED)
    search.budget = replace(search.budget, prune_to=prune_end(search.study.pruner))
    search.run()
    assert prune_end(search.study.pruner) == 100 and asked  # it was asked, and never past step 100
    assert min(asked) >= 40 and max(asked) <= 100
    assert prune_end(optuna.pruners.MedianPruner()) == 0  # Optuna's own pruners: any step


class Waiting(FakeExecutor):
    """A cluster where every other poll finds nothing due (the loop's idle time)."""

    waits = 0

    def poll(self, timeout: float) -> list[RunRecord]:
        self.waits += 1
        return super().poll(timeout) if self.waits % 2 else []


@pytest.mark.parametrize("ahead", [0, 3])
def test_a_large_cluster_asks_trials_ahead_while_nothing_is_due_and_starts_them_as_slots_free(ahead: int) -> None:
    """``asks_ahead``: when nothing is due and no slot is free, the loop asks a trial (claimed,
    suggested, written) and starts it the moment a slot frees; it asks no trial more than owed, and
    every trial ends terminal. Without it (below ``AHEAD_FROM`` slots), a trial is asked only for a
    free slot."""
    assert search_module.asks_ahead(search_module.AHEAD_FROM - 1) == 0 and search_module.asks_ahead(500) == 50
    executor = Waiting(slots=4)
    search = make_search(12, executor, optuna.samplers.RandomSampler(seed=0))
    search.ahead = ahead
    free_at: list[int] = []  # the free slots at each ask
    real = search.study.ask
    search.study.ask = lambda *a, **k: free_at.append(executor.free()) or real(*a, **k)  # type: ignore[method-assign]
    outcomes = search.run()
    trials = search.study.get_trials(deepcopy=False)
    assert len(trials) == len(outcomes) == len(free_at) == 12 and all(t.state.is_finished() for t in trials)
    assert (0 in free_at) == bool(ahead)  # asked with every slot busy
    assert len({s.trial for s in executor.submitted}) == 12
