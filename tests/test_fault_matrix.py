"""Faults end to end, as a user meets them: each leaves the study and its runs in a known state.

The table in docs/operations.md ("What a fault does to a study") lists each fault with the test here (or
elsewhere) that checks it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, ROOT, made_study, run_tuner, terminal_sigint, training

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

FAILING = f"{FIXTURES / 'failing.py'}:Failing"


def _stores(tmp_path: Path) -> list[str]:
    return ["--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
            "--out", str(tmp_path / "best.yaml"), "--num-cpus", "2", "--study", "s1"]


def test_fault_every_trial_fails_one_line_exit_4_study_and_runs_kept(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    result = run_tuner(["launch", "--model", FAILING, "--trials", "2", "--steps", "20", *NO_VERIFY,
                        *_stores(tmp_path)], cwd=tmp_path, timeout=300)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tuner: error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "all 2 trial(s) of study 's1' failed" in lines[0]
    assert "2 x RuntimeError: planted build failure" in lines[0]
    study = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert sorted(r.info.status for r in runs if "trial" in r.data.tags) == ["FAILED", "FAILED"]
    assert [r.info.status for r in runs if r.data.tags.get("tuner.role") == "study"] == ["FAILED"]
    assert not (tmp_path / "best.yaml").exists()


def two_launches(tmp_path: Path, storage: str, tracking: str, study: str, trials: int = 4) -> None:
    """Two launches of one study at once, each on its own embedded cluster of 1 CPU: both finish,
    every trial is terminal, none FAILED (neither failed the other's), one MLflow run per trial."""
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, logs = [], []
    for i in range(2):
        logs.append(tmp_path / f"launch{i}.log")
        args = ["launch", "--trials", str(trials), "--steps", "1000", "--seeds", "1", "--report-every", "100",
                *NO_VERIFY, "--storage", storage, "--tracking-uri", tracking, "--study", study,
                "--out", str(tmp_path / f"best{i}.yaml"), "--num-cpus", "1", "--no-live"]
        with logs[i].open("w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120  # the second starts once the first has made the stores
        while i == 0 and "trial(s) to run" not in " ".join(logs[0].read_text().split()):
            assert procs[0].poll() is None and time.monotonic() < deadline, logs[0].read_text()[-3000:]
            time.sleep(0.5)
    for proc, log in zip(procs, logs, strict=True):
        assert proc.wait(timeout=400) in FINISHED, log.read_text()[-3000:]
    done = optuna.load_study(study_name=study, storage=storage).trials
    assert all(t.state.is_finished() for t in done)
    assert not [t.number for t in done if t.state == optuna.trial.TrialState.FAIL]
    assert len({t.user_attrs["tuner.driver"] for t in done}) == 2  # both drivers ran trials
    assert trials <= len(done) <= trials + 1  # both may ask the last one in the same second
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name(study).experiment_id])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    search = sorted(int(r.data.tags["trial"]) for r in runs if r.data.tags.get("phase") == "search")
    assert search == sorted(t.number for t in done)


def test_fault_two_launches_on_one_sqlite_study_both_finish_none_failed(tmp_path: Path) -> None:
    two_launches(tmp_path, f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'm.db'}", "s1")


def test_fault_ctrl_c_to_the_process_group_leaves_nothing_running_and_the_same_command_finishes(
    tmp_path: Path,
) -> None:
    """SIGINT to the launch's whole process group (a terminal's Ctrl-C reaches Ray's processes too)."""
    from mlflow.tracking import MlflowClient

    args = ["launch", "--trials", "3", "--steps", "1500", "--seeds", "1", "--report-every", "100", *NO_VERIFY,
            *_stores(tmp_path)]
    storage = f"sqlite:///{tmp_path / 't.db'}"
    driver, log = _launch_until_one_trial_finished(tmp_path, args, storage)
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=60) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "tuner: interrupted: study 's1' keeps its " in " ".join(text.split())
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    stopped = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all(t.user_attrs["reason"] == "interrupted (Ctrl-C)" for t in stopped)
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    experiment = client.get_experiment_by_name("s1").experiment_id
    assert not [r.info.run_id for r in client.search_runs([experiment]) if r.info.status == "RUNNING"]

    result = run_tuner(args, cwd=tmp_path, timeout=400)  # the same command finishes the study
    assert result.returncode in FINISHED, result.stdout[-2000:] + result.stderr[-2000:]
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    trained = [t for t in trials if t.state != optuna.trial.TrialState.FAIL]
    assert len(trained) == 3 and all(t.state.is_finished() for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trained}) == 3  # no config trained twice
    reruns = {t.user_attrs.get("rerun_of") for t in trained} - {None}
    assert reruns == {t.number for t in stopped}
    assert not [r.info.run_id for r in client.search_runs([experiment]) if r.info.status == "RUNNING"]


def _launch_until_one_trial_finished(tmp_path: Path, args: list[str], storage: str) -> tuple[subprocess.Popen, Path]:
    """Start ``tuner ARGS`` in a session of its own; return once a trial finished and another runs."""
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  start_new_session=True, preexec_fn=terminal_sigint)
    deadline = time.monotonic() + 240
    # the launch's own line for its first finished trial ("[1/3 ..."), read at once, or the study's
    # states (a query that took seconds in a loaded pytest process: the launch had ended meanwhile)
    while "[1/" not in log.read_text() and not _running_after_one_finished(storage):
        assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return driver, log


def _running_after_one_finished(storage: str) -> bool:
    made = made_study(storage, "s1")
    if made is None:
        return False
    states = [t.state for t in made.trials]
    return optuna.trial.TrialState.RUNNING in states and any(s.is_finished() for s in states)


def test_fault_embedded_node_lost_mid_study_restarts_the_cluster_and_finishes(tmp_path: Path) -> None:
    """The embedded node's raylet and workers killed (an out-of-memory kill): a fresh cluster within
    --placement-timeout, the study finishes, nothing RUNNING, no traceback, within 3 minutes."""
    args = ["launch", "--trials", "3", "--steps", "1500", "--seeds", "1", "--report-every", "100", *NO_VERIFY,
            "--placement-timeout", "3", *_stores(tmp_path)]
    storage = f"sqlite:///{tmp_path / 't.db'}"
    driver, log = _launch_until_one_trial_finished(tmp_path, args, storage)
    processes = subprocess.run(["ps", "-s", str(driver.pid), "-o", "pid=,comm=,args="], capture_output=True,
                               text=True, check=True).stdout.splitlines()
    victims = [int(p.split()[0]) for p in processes if p.split()[1] == "raylet" or "TrialWorker" in p]
    assert victims, processes
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    try:
        assert driver.wait(timeout=180) in FINISHED, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert time.monotonic() - killed < 180
    text = log.read_text()
    assert "restarting the embedded Ray cluster" in " ".join(text.split()) and "Traceback" not in text
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    # every trial ended as it trained (survived, diverged or stopped): none FAILED, the runs the lost node
    # held were retried on the fresh cluster
    assert len(trials) == 3 and all(t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL for t in trials)


@pytest.mark.cluster
def test_fault_joined_cluster_loses_its_only_worker_node_stops_with_one_line(tmp_path: Path) -> None:
    """--address: the only node with CPUs killed mid-study; after --placement-timeout the launch
    stops with one line and exit 5, its trials FAIL and queued again, nothing RUNNING."""
    from mlflow.tracking import MlflowClient

    from tests.cluster import kill_group, names_port, start_cluster

    nodes = start_cluster(head_cpus=0, workers=1, worker_cpus=2)
    try:
        args = ["launch", "--address", nodes.address, "--trials", "3", "--steps", "100000", "--seeds", "1",
                "--report-every", "100", *NO_VERIFY, "--placement-timeout", "3", *_stores(tmp_path)]
        storage = f"sqlite:///{tmp_path / 't.db'}"
        log = tmp_path / "launch.log"
        with log.open("w") as out:
            driver = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=tmp_path, stdout=out,
                                      stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 240
        while not training(storage):  # a run is training on the worker node
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        kill_group(nodes.workers[0])
        assert driver.wait(timeout=120) == 5, log.read_text()[-3000:]
    finally:
        nodes.stop()
    assert not names_port(nodes.port)  # stopped: a plain ray.init() here no longer looks for it
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("tuner: error:")]
    assert len(errors) == 1 and "could host a seed run for 3 s" in errors[0] and "Traceback" not in text
    assert "no alive Ray node can host a seed run" in " ".join(text.split())
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    stopped = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all("CapacityLost" in t.user_attrs["reason"] for t in stopped)
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    experiment = client.get_experiment_by_name("s1").experiment_id
    assert not [r.info.run_id for r in client.search_runs([experiment]) if r.info.status == "RUNNING"]


def test_fault_full_disk_under_out_keeps_the_earlier_best_config_one_line_exit_6(tmp_path: Path) -> None:
    """A real full disk (a tmpfs filled to the last byte) under --out: every trial trains, then the
    write fails; the earlier best_config.yaml is left exactly as it was, no temporary file stays, one
    line says so (exit 6), nothing is RUNNING, and the same command with space writes it untrained."""
    import yaml
    from mlflow.tracking import MlflowClient

    from tests.fulldisk import full_disk

    earlier = b"config:\n  learning_rate: 0.001\nstudy:\n  name: s1\n"
    storage = f"sqlite:///{tmp_path / 't.db'}"
    out = tmp_path / "disk" / "best.yaml"
    args = ["launch", "--trials", "2", "--steps", "20", "--seeds", "1", *NO_VERIFY, "--no-margin", "--no-live",
            "--storage", storage, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--out", str(out),
            "--num-cpus", "2", "--study", "s1"]
    with full_disk(out.parent, {out.name: earlier}) as disk:
        result = run_tuner(args, cwd=tmp_path, timeout=300)
        assert result.returncode == 6, result.stdout[-2000:] + result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.startswith("tuner:")]
        assert len(lines) == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr
        assert f"cannot write {out}: the disk holding {disk} is full" in lines[0]
        assert "study 's1' is kept" in lines[0] and "run the same command again" in lines[0]
        assert out.read_bytes() == earlier
        assert sorted(p.name for p in disk.iterdir()) == [".filler", out.name]  # no temporary file left
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    assert len(trials) == 2 and all(t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL for t in trials)
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags.get("tuner.role") == "study"] == ["FAILED"]
    again = run_tuner(args, cwd=tmp_path, timeout=300)  # the disk unmounted: the same folder, with space
    assert again.returncode in FINISHED, again.stdout[-2000:] + again.stderr[-2000:]
    assert "nothing to train" in " ".join(again.stdout.split())
    assert yaml.safe_load(out.read_text())["study"]["trial"] in {t.number for t in trials}
