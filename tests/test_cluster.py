"""A real 2-node Ray cluster on this machine: runs on both nodes, a lost node, a killed driver,
and an MLflow server that goes away mid-study. Each launch is a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest

from tests.cluster import RayNodes, free_port, kill_group, start_cluster, start_mlflow_server
from tests.conftest import FINISHED, NO_VERIFY, ROOT, expected_status, made_study, run_tuner, training
from tuner.driver.trialrecord import read

pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.tf, pytest.mark.slow]



@pytest.fixture(scope="module")
def cluster() -> Iterator[RayNodes]:
    nodes = start_cluster(head_cpus=1, workers=1, worker_cpus=1)
    yield nodes
    nodes.stop()


def launch_args(tmp: Path, address: str, trials: int, steps: int = 200, tracking: str | None = None) -> list[str]:
    return [
        "launch", "--address", address, "--trials", str(trials), "--steps", str(steps), "--seeds", "2",
        "--study", "s", "--storage", f"sqlite:///{tmp / 't.db'}",
        "--tracking-uri", tracking or f"sqlite:///{tmp / 'm.db'}", "--out", str(tmp / "best.yaml"),
        "--report-every", "20", *NO_VERIFY,
        # a trial's seeds side by side, one on each node (first-seed runs a trial's first seed alone: a
        # node may then sit idle, and a trial whose first seed diverges never runs its second)
        "--pruner", "none",
    ]


def start_tuner(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def study(tmp: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=f"sqlite:///{tmp / 't.db'}")


def wait_until(condition: Callable[[], bool], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def states(tmp: Path) -> list[optuna.trial.TrialState]:
    """The trial states so far ([] before the driver has created the study)."""
    made = made_study(f"sqlite:///{tmp / 't.db'}", "s")
    return [t.state for t in made.trials] if made is not None else []


def finished(tmp: Path) -> int:
    return sum(s.is_finished() for s in states(tmp))


def running(tmp: Path) -> bool:
    return optuna.trial.TrialState.RUNNING in states(tmp)


def mlflow_runs(uri: str) -> dict[int, object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("s")
    runs = [r for r in client.search_runs([experiment.experiment_id], max_results=1000) if "trial" in r.data.tags]
    by_trial = {(r.data.tags["mlflow.parentRunId"], int(r.data.tags["trial"])): r for r in runs}
    assert len(by_trial) == len(runs), "a launch has two MLflow runs for one trial"
    return {trial: r for (_, trial), r in by_trial.items()}


def check_terminal(tmp: Path, uri: str, expect_finished: int) -> list[optuna.trial.FrozenTrial]:
    """Every trial finished in Optuna, and its MLflow run closed with the matching status."""
    trials = study(tmp).trials
    assert not [t.number for t in trials if not t.state.is_finished()]
    interrupted = {t.user_attrs["rerun_of"] for t in trials if "rerun_of" in t.user_attrs}
    assert len(trials) - len(interrupted) == expect_finished
    runs = mlflow_runs(uri)
    for t in trials:
        run = runs[t.number]
        assert run.data.tags["status"] == expected_status(t), t.number
        assert run.info.status in ("FINISHED", "FAILED", "KILLED")
        if t.number in interrupted:
            assert run.info.status == "KILLED"
    return trials


def test_cluster_runs_execute_on_both_nodes(cluster: RayNodes, tmp_path: Path) -> None:
    result = run_tuner(launch_args(tmp_path, cluster.address, trials=3), cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-2000:] + result.stderr[-2000:]
    trials = check_terminal(tmp_path, f"sqlite:///{tmp_path / 'm.db'}", 3)
    nodes = {n for t in trials for n in read(t).nodes}
    assert len(nodes) == 2  # one slot per node: the two seeds of a trial run on different nodes
    runs = mlflow_runs(f"sqlite:///{tmp_path / 'm.db'}")
    assert {n for r in runs.values() for n in r.data.tags["node_ids"].split(",")} == nodes
    per_run = [{r.data.tags[f"s{i}.node_id"] for i in range(len(r.data.tags["seeds"].split(",")))
                if f"s{i}.node_id" in r.data.tags} for r in runs.values()]  # a cancelled sibling may have none
    assert all(per_run) and set().union(*per_run) == nodes  # each seed run's node, as a tag


def test_cluster_killed_driver_then_same_command_continues(cluster: RayNodes, tmp_path: Path) -> None:
    args = [*launch_args(tmp_path, cluster.address, trials=4, steps=600), "--grace-period", "6"]
    driver = start_tuner(args, tmp_path)
    wait_until(lambda: finished(tmp_path) >= 1)
    wait_until(lambda: running(tmp_path))
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    left = [t.number for t in study(tmp_path).trials if t.state == optuna.trial.TrialState.RUNNING]
    assert left  # the dead driver left a trial running
    result = run_tuner(args, cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "was left running by a stopped launch" in result.stdout
    trials = check_terminal(tmp_path, f"sqlite:///{tmp_path / 'm.db'}", 4)
    reruns = {t.user_attrs["rerun_of"]: t for t in trials if "rerun_of" in t.user_attrs}
    for number in left:
        assert trials[number].state == optuna.trial.TrialState.FAIL
        assert reruns[number].params == trials[number].params  # its config ran again


def test_cluster_tracking_server_down_mid_study_loses_nothing(cluster: RayNodes, tmp_path: Path) -> None:
    port = free_port()
    backend = f"sqlite:///{tmp_path / 'server.db'}"
    server = start_mlflow_server(backend, port)
    uri = f"http://127.0.0.1:{port}"
    try:
        driver = start_tuner(launch_args(tmp_path, cluster.address, trials=4, tracking=uri), tmp_path)
        wait_until(lambda: finished(tmp_path) >= 1)
        kill_group(server)
        wait_until(lambda: finished(tmp_path) >= 2)  # training goes on while MLflow is down
        server = start_mlflow_server(backend, port)
        output, _ = driver.communicate(timeout=300)
        assert driver.returncode in FINISHED, output[-3000:]
        assert "is not answering" in output and "answers again" in output
        assert "View run" not in output  # MLflow's own stdout lines over HTTP (tuner.driver.launch.quiet_third_party)
        check_terminal(tmp_path, uri, 4)
        history = mlflow_runs(uri)
        assert all("s0/steps_survived" in r.data.metrics for r in history.values())
    finally:
        kill_group(server)


def worker_pids(cluster: RayNodes) -> list[int]:
    """Pids of this cluster's tuner workers: children of a raylet in one of its nodes' groups."""
    groups = {p.pid for p in [cluster.head, *cluster.workers]}
    out = subprocess.run(["ps", "-eo", "pid,ppid,pgid,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()[1:]]
    group_of = {int(pid): int(pgid) for pid, _, pgid, _ in rows}
    return [int(pid) for pid, ppid, _, args in rows
            if "ray::TrialWorker" in args and group_of.get(int(ppid)) in groups]


def test_cluster_random_worker_killed_mid_study_every_trial_terminal(cluster: RayNodes, tmp_path: Path) -> None:
    driver = start_tuner(launch_args(tmp_path, cluster.address, trials=3, steps=2000), tmp_path)
    wait_until(lambda: training(f"sqlite:///{tmp_path / 't.db'}", "s"))  # the workers have runs (below)
    time.sleep(3)
    victim = random.choice(worker_pids(cluster))
    os.kill(victim, signal.SIGKILL)
    output, _ = driver.communicate(timeout=400)
    assert driver.returncode in FINISHED, output[-3000:]
    assert "worker died" in output
    trials = check_terminal(tmp_path, f"sqlite:///{tmp_path / 'm.db'}", 3)
    assert len(trials) == 3 and all(t.state.is_finished() for t in trials)


def test_cluster_lost_node_runs_are_retried_and_study_finishes(cluster: RayNodes, tmp_path: Path) -> None:
    """Last in this module: it kills the worker node."""
    driver = start_tuner(launch_args(tmp_path, cluster.address, trials=3, steps=3000), tmp_path)
    # a seed has reported a step: the workers have imported TensorFlow (both start together, and a
    # trial's seeds run side by side); a RUNNING trial alone may still be waiting for them, and a
    # node killed before its worker got a run has no run to retry
    wait_until(lambda: training(f"sqlite:///{tmp_path / 't.db'}", "s"))
    time.sleep(4)  # both seeds are training, one on each node
    kill_group(cluster.workers.pop())
    output, _ = driver.communicate(timeout=400)
    assert driver.returncode in FINISHED, output[-3000:]
    assert "worker died" in output and "retrying" in output
    trials = check_terminal(tmp_path, f"sqlite:///{tmp_path / 'm.db'}", 3)
    assert all(t.state != optuna.trial.TrialState.FAIL for t in trials)  # retried, not failed
