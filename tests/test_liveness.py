"""Heartbeats on real SQLite stores: only a dead driver's trials and runs are repaired; a resumed
study never replays a config it already trained."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest

from tests.test_search import KNOBS, FakeExecutor
from tuner import hooks
from tuner.config import LaunchConfig
from tuner.driver.launch import open_study, repair
from tuner.driver.liveness import Liveness, counted
from tuner.driver.search import Budget, Search, make_sampler
from tuner.driver.trialrecord import DUPLICATE_OF, RERUN_OF
from tuner.records import TrainConfig
from tuner.spaces import space_from

LR = {"learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
RUNNING = optuna.trial.TrialState.RUNNING


@pytest.mark.slow
def test_repair_fails_only_the_dead_drivers_trials_and_runs(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import Tracker

    url, uri = f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    drivers = {name: Liveness(grace=2) for name in ("live", "dead", "new")}
    studies = {name: optuna.load_study(study_name="s", storage=d.storage(url)) if name != "live" else
               optuna.create_study(study_name="s", storage=d.storage(url)) for name, d in drivers.items()
               if name != "new"}
    trials, trackers = {}, {}
    for name in ("live", "dead"):
        drivers[name].attach(studies[name])
        trials[name] = studies[name].ask(LR)
        drivers[name].claim(trials[name])
        hooks.flush_held(studies[name])  # its owner tag, as the search writes it: with its parameters
        trackers[name] = Tracker(uri, "s", {}, driver=drivers[name].driver)
        trackers[name].on_trial_start(trials[name].number, TrainConfig(1e-3), (0, 1))
        assert trackers[name].flush()
    drivers["dead"].stop()  # killed: no more heartbeats
    time.sleep(3.0)  # past the grace period; the live driver beats every second

    study = optuna.load_study(study_name="s", storage=drivers["new"].storage(url))
    new_tracker = Tracker(uri, "s", {}, driver=drivers["new"].driver)
    try:
        assert repair(study, new_tracker, drivers["new"]) == 0
        states = {t.number: t.state for t in study.get_trials()}
        assert states[trials["live"].number] == RUNNING
        assert states[trials["dead"].number] == optuna.trial.TrialState.FAIL
        (rerun,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        assert rerun.user_attrs[RERUN_OF] == trials["dead"].number
        assert rerun.system_attrs["fixed_params"] == trials["dead"].params
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
        status = {(r.data.tags["tuner.driver"], r.data.tags.get("trial", "launch")): r.info.status for r in runs}
        live, dead = drivers["live"].driver, drivers["dead"].driver
        assert status[(live, str(trials["live"].number))] == "RUNNING" and status[(live, "launch")] == "RUNNING"
        assert status[(dead, str(trials["dead"].number))] == "KILLED" and status[(dead, "launch")] == "KILLED"
    finally:
        for driver in drivers.values():
            driver.stop()
        for tracker in (*trackers.values(), new_tracker):
            tracker.close(wait=1.0)


def _launch_config(tmp_path: Path) -> LaunchConfig:
    return LaunchConfig(storage=f"sqlite:///{tmp_path / 't.db'}", study="s", seed=0, grace_period=2)


def _search(tmp_path: Path, trials: int, params: dict) -> Search:
    space = space_from(params, "fake", KNOBS, "<test>")
    liveness = Liveness(grace=2)
    study = open_study(_launch_config(tmp_path), space, liveness)
    repair(study, None, liveness)
    return Search(study, space, "fake", FakeExecutor(), Budget(trials, steps=100, seeds=2, report_every=20),
                  liveness=liveness)


def test_resumed_study_interrupted_during_random_startup_never_replays_a_config(tmp_path: Path) -> None:
    """Launch 1 trains 3 of the 4 random start-up trials and is interrupted; launch 2 finishes 8."""
    params = {"learning_rate": {"low": 1e-5, "high": 1.0, "log": True}, "width": {"low": 1, "high": 64}}
    first = _search(tmp_path, 3, params)
    first.run()
    first.liveness.stop()  # type: ignore[union-attr]
    second = _search(tmp_path, 8, params)
    second.run()
    second.liveness.stop()  # type: ignore[union-attr]
    trials = second.study.get_trials()
    assert counted(trials) == 8 and second.duplicates == 0
    configs = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(configs)) == len(configs) == 8
    # without the reseed, launch 2's sampler (seed 0) would start again from trial 0's config
    fresh = optuna.create_study(sampler=make_sampler("tpe", 0, 2))
    replayed = fresh.ask()
    space_from(params, "fake", KNOBS, "<test>").suggest(replayed)
    assert tuple(sorted(replayed.params.items())) == configs[0]


def test_config_an_earlier_launch_trained_is_failed_untrained_and_not_counted(tmp_path: Path) -> None:
    """A space of two configs: launch 1 trains both; launch 2 asked for four trains none of them again."""
    params = {"width": {"choices": [3, 5]}, "learning_rate": 1e-3}
    first = _search(tmp_path, 2, params)
    for width in (3, 5):
        first.study.enqueue_trial({"width": width})
    first.run()
    first.liveness.stop()  # type: ignore[union-attr]
    second = _search(tmp_path, 4, params)
    second.run()
    second.liveness.stop()  # type: ignore[union-attr]
    trials = second.study.get_trials()
    assert second.executor.submitted == [] and second.duplicates == 20  # type: ignore[attr-defined]
    repeats = [t for t in trials if DUPLICATE_OF in t.user_attrs]
    assert len(repeats) == 20 and all(t.state == optuna.trial.TrialState.FAIL for t in repeats)
    assert all(t.state.is_finished() for t in trials) and counted(trials) == 2


@pytest.mark.parametrize("held", [1, 3])
def test_resumed_seed_differs_from_the_first_launch(held: int) -> None:
    from tuner.driver.launch import resumed_seed

    assert resumed_seed(0, held) != 0 and resumed_seed(0, held) == resumed_seed(0, held)


def test_a_config_stopped_mid_run_is_queued_again_at_most_max_retries_times(tmp_path: Path) -> None:
    """A config that hangs a launch, stopped each time (SIGTERM, a killed driver), is not rerun for ever."""
    liveness = Liveness(grace=30, max_retries=1)
    study = optuna.create_study(study_name="s", storage=liveness.storage(f"sqlite:///{tmp_path / 't.db'}"))
    liveness.attach(study)
    try:
        first = study.ask(LR)
        liveness.claim(first)
        assert liveness.abandon("stopped by SIGTERM") == [first.number]
        second = study.ask(LR)  # the rerun that was queued
        assert second.user_attrs[RERUN_OF] == first.number and second.params == first.params
        liveness.claim(second)
        assert liveness.abandon("stopped by SIGTERM") == [second.number]
        assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # started 2 = 1 + --max-retries 1
        assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.FAIL] * 2
    finally:
        liveness.stop()


def test_storage_opens_a_new_database_whose_tables_another_launch_made_at_the_same_instant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy.exc

    real, calls = optuna.storages.RDBStorage, []
    unique = Exception("UNIQUE constraint failed: alembic_version.version_num")

    class Racing(real):  # type: ignore[misc,valid-type]
        def __init__(self, url: str, **kwargs: object) -> None:
            calls.append(url)
            if len(calls) == 1:  # what the later of two launches on a new file meets (seen in CI)
                real(url)  # the other launch makes the tables and stamps the version meanwhile
                raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version", {}, unique)
            super().__init__(url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    url = f"sqlite:///{tmp_path}/new.db"
    study = optuna.create_study(study_name="s", storage=Liveness(30).storage(url))
    assert len(calls) == 2 and study.study_name == "s"


def test_storage_does_not_retry_a_database_it_cannot_open(tmp_path: Path) -> None:
    import sqlalchemy.exc

    started = time.monotonic()
    with pytest.raises(sqlalchemy.exc.OperationalError, match="unable to open database file"):
        Liveness(30).storage(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    assert time.monotonic() - started < 5  # no retries
