"""MLflow tracking through a store that loses answers (retries log everything once, nothing twice),
behind a store slower than the records (telemetry in telemetry.json, nothing lost), and the names of
per-seed metrics (by the seed's position in its run, the same in every run)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tuner.records import Phase, RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState


def lose_first_answer(method: Callable[..., Any], lost: list[str]) -> Callable[..., Any]:
    """``method``, whose first call reaches the store and then fails as if the answer was lost."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        if method.__name__ not in lost:
            lost.append(method.__name__)
            raise ConnectionError(f"{method.__name__}: connection reset before the answer")
        return result

    return call


def test_tracker_retries_after_lost_answers_make_one_run_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker(uri, "lossy", {"model": "planted"})
    lost: list[str] = []
    for name in ("create_run", "log_batch", "set_terminated"):
        monkeypatch.setattr(tracker.client, name, lose_first_answer(getattr(tracker.client, name), lost))
    config = TrainConfig(1e-2)
    tracker.on_trial_start(0, config, (0,))
    records = [RunRecord(0, 0, step, RunStatus.RUNNING, loss=1.0 / step) for step in (10, 20, 30)]
    final = RunRecord(0, 0, 30, RunStatus.SURVIVED, final=True, steps_survived=30, val_loss=0.5)
    for record in [*records, final]:
        tracker.on_trial_result(record)
    tracker.on_trial_complete(TrialOutcome(0, config, TrialState.SURVIVED, (final,), value=0.5))
    tracker.close()
    assert sorted(lost) == ["create_run", "log_batch", "set_terminated"]  # each failed once

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lossy")
    children = [r for r in client.search_runs([experiment.experiment_id]) if "trial" in r.data.tags]
    assert len(children) == 1  # the retried creation found the run the lost answer had made
    run = children[0]
    assert (run.data.tags["status"], run.info.status) == ("survived", "FINISHED")
    assert run.data.params["learning_rate"] == "0.01"
    history = client.get_metric_history(run.info.run_id, "s0/loss")
    assert [m.step for m in history] == [10, 20, 30]  # once each, though a batch was sent twice


def test_restart_closes_a_dead_drivers_runs_and_logs_the_trial_it_never_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import optuna
    from mlflow.tracking import MlflowClient

    from tuner import hooks
    from tuner.driver.launch import repair
    from tuner.driver.liveness import Liveness
    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    killed = Liveness(grace=2)  # the driver that is killed: its heartbeats stop, its runs stay RUNNING
    study = optuna.create_study(study_name="s", storage=killed.storage(f"sqlite:///{tmp_path / 't.db'}"))
    killed.attach(study)
    lr = {"learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    done = study.ask(lr)
    study.tell(done, 0.5)
    running, unlogged = study.ask(lr), study.ask(lr)
    killed.claim(running)
    killed.claim(unlogged)
    hooks.flush_held(study)  # their owner tags, as the search writes them: with their parameters
    dead = Tracker(uri, "s", {"model": "planted"}, driver=killed.driver)
    dead.on_trial_start(done.number, TrainConfig(1e-3), (0, 1))
    dead.on_trial_start(running.number, TrainConfig(2e-3), (0, 1))
    assert dead.flush()  # ... and it was killed before it logged the third trial
    killed.stop()
    time.sleep(4.5)  # the grace period passes without a heartbeat (with a margin: it failed once under load at 2.5)

    restart = Liveness(grace=2)
    again = Tracker(uri, "s", {"model": "planted"}, driver=restart.driver)
    repair(study, again, restart)
    restart.stop()
    again.close()

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("s")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "trial" in r.data.tags]
    by_trial = {int(r.data.tags["trial"]): r for r in runs}
    assert len(by_trial) == len(runs) == 3  # one run per trial, the unlogged one included
    got = {n: (r.data.tags["status"], r.info.status) for n, r in by_trial.items()}
    assert got == {done.number: ("survived", "FINISHED"), running.number: ("failed", "KILLED"),
                   unlogged.number: ("failed", "KILLED")}
    assert by_trial[unlogged.number].data.params["learning_rate"] == str(unlogged.params["learning_rate"])


def writer(uri: str, process: bool) -> Any:
    """The tracker's client: None (its own, in the driver) or an MLflow client in a process of its own
    (a large cluster's, tuner.driver.mlflow_process): the tests below take both."""
    from tuner.driver.mlflow_process import ClientProcess

    return ClientProcess(uri) if process else None


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_tracker_behind_puts_telemetry_in_telemetry_json_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process: bool
) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver import mlflow_sender
    from tuner.driver.tracking import TELEMETRY_FILE, Tracker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mlflow_sender, "_SPILL", -1)  # as if the queue were always long: every record spills
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker(uri, "behind", {"model": "planted"}, writer(uri, process))
    config = TrainConfig(1e-2)
    for number in (0, 1):  # trial 1 is still running when the tracker closes (an interrupted launch)
        tracker.on_trial_start(number, config, (7,))
        for step in (10, 20, 30):
            tracker.on_trial_result(RunRecord(number, 7, step, RunStatus.RUNNING, loss=1.0 / step, grad_norm=2.0,
                                              metrics={"grad_norm/w": float(step), "clip_fraction": float("nan")}))
    final = RunRecord(0, 7, 30, RunStatus.SURVIVED, final=True, steps_survived=30, loss=0.1, grad_norm=1.5,
                      val_loss=0.5)
    tracker.on_trial_result(final)
    tracker.on_trial_complete(TrialOutcome(0, config, TrialState.SURVIVED, (final,), value=0.5))
    tracker.close()

    client = MlflowClient(uri)
    runs = {r.data.tags["trial"]: r.info.run_id for r in client.search_runs([tracker.experiment_id])
            if "trial" in r.data.tags}
    for trial, run_id in runs.items():
        assert [m.step for m in client.get_metric_history(run_id, "s0/loss")] == [10, 20, 30] + (
            [30] if trial == "0" else [])  # every record's loss is a metric point
        assert client.get_metric_history(run_id, "s0/grad_norm/w") == []
        path = client.download_artifacts(run_id, TELEMETRY_FILE, str(tmp_path / trial))
        rows = json.loads(Path(path).read_text())["s0"]  # seed 7, the run's first
        assert rows == [{"step": s, "grad_norm": 2.0, "grad_norm/w": float(s)} for s in (10, 20, 30)]  # NaN left out
    history = client.get_metric_history(runs["0"], "s0/grad_norm")
    assert [(m.step, m.value) for m in history] == [(30, 1.5)]  # a final record's values stay metric points


def seed_run(number: int, seed: int, val_loss: float, phase: Phase = Phase.SEARCH) -> list[RunRecord]:
    """A seed run's records: two progress records with telemetry, then its final record (on node-<seed>)."""
    progress = [RunRecord(number, seed, step, RunStatus.RUNNING, loss=1.0 / step, grad_norm=2.0,
                          metrics={"grad_norm/w": float(step)}, phase=phase) for step in (10, 20)]
    final = RunRecord(number, seed, 20, RunStatus.SURVIVED, final=True, steps_survived=20, val_loss=val_loss,
                      metrics={"grad_norm_max": 3.0}, info={"node_id": f"node-{seed}"}, phase=phase)
    return [*progress, final]


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_per_seed_metrics_are_named_by_position_so_every_run_has_the_same_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process: bool
) -> None:
    """Two trials on different seed values (the study's seed stream) log the same metric and tag keys;
    a run's ``seeds`` tag and param give the value at each position, races numbered in their own runs."""
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri, config = f"sqlite:///{tmp_path / 'm.db'}", TrainConfig(1e-2)
    tracker = Tracker(uri, "positions", {"model": "planted"}, writer(uri, process))
    seeds = {0: (11, 12), 1: (22, 21)}  # trial 1's first seed is the larger: a position is not a rank
    losses = {11: 0.5, 12: 0.6, 22: 0.7, 21: 0.8, 31: 0.4, 32: 0.3}
    for number, (first, second) in seeds.items():
        tracker.on_trial_start(number, config, (first, second))
        runs = [seed_run(number, seed, losses[seed]) for seed in (second, first)]  # the second seed reports first
        for record in [r for records in zip(*runs, strict=True) for r in records]:
            tracker.on_trial_result(record)
    finals = {number: tuple(seed_run(number, s, losses[s])[-1] for s in pair) for number, pair in seeds.items()}
    tracker.on_phase_start(0, Phase.RACE, config, (31, 32))  # trial 0 races on two more seeds
    race = [seed_run(0, seed, losses[seed], Phase.RACE) for seed in (31, 32)]
    for record in [*race[0], *race[1]]:
        tracker.on_trial_result(record)
    raced = (race[0][-1], race[1][-1])
    tracker.on_phase_end(TrialOutcome(0, config, TrialState.SURVIVED, raced, value=0.35, phase=Phase.RACE))
    tracker.on_trial_complete(TrialOutcome(0, config, TrialState.SURVIVED, finals[0] + raced, value=0.45))
    tracker.on_trial_complete(TrialOutcome(1, config, TrialState.SURVIVED, finals[1], value=0.75))
    tracker.close()

    client = MlflowClient(uri)
    found = client.search_runs([tracker.experiment_id])
    runs = {(r.data.tags["trial"], r.data.tags["phase"]): r for r in found if "trial" in r.data.tags}
    trial0, trial1, race_run = runs["0", "search"], runs["1", "search"], runs["0", "race"]
    per_seed = {"s0", "s1"}
    assert {k.split("/")[0] for k in trial1.data.metrics if "/" in k} == per_seed
    assert set(trial1.data.metrics) == set(race_run.data.metrics)  # the same columns, whatever the seed values
    assert {k for k in trial1.data.tags if k.endswith(".node_id")} == {"s0.node_id", "s1.node_id"}
    assert (trial1.data.tags["seeds"], trial1.data.params["seeds"]) == ("22,21", "22,21")
    assert trial1.data.metrics["s0/val_loss"] == 0.7 and trial1.data.tags["s0.node_id"] == "node-22"
    assert [m.step for m in client.get_metric_history(trial1.info.run_id, "s1/grad_norm/w")] == [10, 20]
    assert (race_run.data.tags["seeds"], race_run.data.metrics["s1/val_loss"]) == ("31,32", 0.3)  # its own positions
    # the trial's own run: its search seeds, then its race seeds' summaries
    assert (trial0.data.tags["seeds"], trial0.data.params["seeds"]) == ("11,12,31,32", "11,12")
    assert trial0.data.metrics["s3/val_loss"] == 0.3 and trial0.data.tags["s3.node_id"] == "node-32"
    keys = [k for run in runs.values() for k in [*run.data.metrics, *run.data.tags]]
    assert not [k for k in keys if re.match(r"seed\d", k)]  # no name holds a seed's value
