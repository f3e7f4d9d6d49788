"""Faults of a run or a store mid-launch, each a real launch (real Ray, SQLite, MLflow, TensorFlow):
a model whose build hangs, an MLflow store whose disk fills up, a driver killed while it verifies.
Each checks the exit status, the one line, no traceback, and nothing RUNNING in Optuna or MLflow
afterwards (issue 27; docs/operations.md's fault table)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, ROOT, run_tuner

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

HANGING = f"{FIXTURES / 'hanging.py'}:Hanging"


def _runs(uri: str, study: str = "s1") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(study).experiment_id], max_results=1000)


def test_fault_a_hung_build_is_ended_its_trial_fails_not_queued_and_the_launch_goes_on(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  learning_rate: {low: 1.0e-3, high: 1.0e-2, log: true}\n"
                     "  hang: {choices: [false, true]}\n")
    storage, uri = f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    result = run_tuner(["launch", "--model", HANGING, "--space", str(space), "--trials", "4", "--steps", "50",
                        "--seeds", "1", *NO_VERIFY, "--no-margin", "--no-live", "--storage", storage,
                        "--tracking-uri", uri, "--num-cpus", "2", "--study", "s1", "--run-timeout", "15",
                        "--sampler", "random", "--seed", "3", "--out", str(tmp_path / "best.yaml")],
                       cwd=tmp_path, timeout=300)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    hung = [t for t in trials if t.params["hang"]]
    assert hung and all(t.state == optuna.trial.TrialState.FAIL for t in hung)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials if not t.params["hang"])
    assert len(trials) == 4  # nothing queued again
    from tuner.driver.trialrecord import read

    assert all(read(t).reason.startswith("no progress for ") and "while building the graph" in read(t).reason
               for t in hung)
    runs = _runs(uri)
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert {r.data.tags["trial"]: r.data.tags["status"] for r in runs if "trial" in r.data.tags} == {
        str(t.number): "failed" if t.params["hang"] else "survived" for t in trials}


def test_fault_mlflow_disk_fills_mid_launch_one_line_exit_0_report_closes_and_logs_the_rest(tmp_path: Path) -> None:
    from tests.fulldisk import fill, full_disk

    storage = f"sqlite:///{tmp_path / 't.db'}"
    with full_disk(tmp_path / "disk", size="3m", filled=False) as disk:
        uri = f"sqlite:///{disk / 'm.db'}"
        log = tmp_path / "launch.log"
        with log.open("w") as out:
            driver = subprocess.Popen(
                [sys.executable, "-m", "tuner", "launch", "--trials", "4", "--steps", "300", "--seeds", "1",
                 *NO_VERIFY, "--no-margin", "--no-live", "--storage", storage, "--tracking-uri", uri,
                 "--num-cpus", "2", "--study", "s1", "--out", str(tmp_path / "best.yaml")],
                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 240
        while "trial(s) to run" not in " ".join(log.read_text().split()):  # MLflow's store and runs made
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        fill(disk / "filler")
        assert driver.wait(timeout=300) in FINISHED, log.read_text()[-3000:]
        text = " ".join(log.read_text().split())
        assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
        assert text.count("cannot store anything (database or disk is full)") == 1, text[-3000:]
        (disk / "filler").unlink()  # space again
        report = run_tuner(["report", "--study", "s1", "--storage", storage, "--tracking-uri", uri,
                            "--out-dir", str(tmp_path)], cwd=tmp_path, timeout=120)
        assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
        assert "MLflow: closed " in report.stdout
        runs = _runs(uri)
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    trials = optuna.load_study(study_name="s1", storage=storage).trials
    own = {r.data.tags["trial"] for r in runs if r.data.tags.get("phase") == "search"}
    assert own == {str(t.number) for t in trials}  # every trial the study holds has its run


def test_fault_driver_killed_while_verifying_the_same_command_closes_every_run_it_left(tmp_path: Path) -> None:
    """kill -9 of the driver during verification; the same command right away (the dead driver's last
    beat is still within the grace period) ends with no run of it RUNNING."""
    storage, uri = f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    args = ["launch", "--trials", "2", "--steps", "60", "--seeds", "1", "--race-seeds", "0", "--verify-seeds", "2",
            "--verify-steps", "3000", "--no-margin", "--no-live", "--storage", storage, "--tracking-uri", uri,
            "--num-cpus", "2", "--study", "s1", "--grace-period", "6", "--out", str(tmp_path / "best.yaml")]
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  start_new_session=True)
    deadline = time.monotonic() + 240
    # the store is read only once the launch made it ("trial(s) to run"): a reader that opens it earlier
    # runs MLflow's migrations beside the launch's own, and one of them finds the other's half-done
    while "trial(s) to run" not in " ".join(log.read_text().split()) or not [
            r for r in _runs_or_none(uri) if r.data.tags.get("phase") == "verify"]:
        assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    left = subprocess.run(["ps", "-s", str(driver.pid), "-o", "pid="], capture_output=True, text=True).stdout.split()
    for pid in left:  # the dead launch's cluster (its own test: tests/test_ports.py)
        os.kill(int(pid), signal.SIGKILL)
    left_running = {r.info.run_id for r in _runs(uri) if r.info.status == "RUNNING"}  # what the dead driver left
    assert left_running

    again = run_tuner(args, cwd=tmp_path, timeout=400)  # the same command
    assert again.returncode in FINISHED, again.stdout[-2000:] + again.stderr[-2000:]
    running = [(r.data.tags.get("phase"), r.data.tags.get("tuner.role")) for r in _runs(uri)
               if r.info.status == "RUNNING"]
    assert not running, running
    closed = {r.info.run_id: r for r in _runs(uri) if r.info.run_id in left_running}
    assert {r.info.status for r in closed.values()} == {"KILLED"}  # cut short: its verify and launch runs too
    assert "verify" in {r.data.tags.get("phase") for r in closed.values()}


def _runs_or_none(uri: str) -> list:
    try:
        return _runs(uri)
    except Exception:  # the store or the experiment is not there yet
        return []
