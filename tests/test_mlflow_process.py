"""The MLflow client in a process of its own (a large cluster's tracker, tuner.driver.mlflow_process),
on a real SQLite store: it survives the stop signals a terminal sends the process group, a killed
child loses nothing (the sender retries into a new one), the child's errors keep the words and errno
the sender reads, the child ends with the tracker or a dead driver, and a launch on a large cluster
uses it. The tracker's own tests run through it as well (tests/test_tracking.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_ports import alive
from tuner.records import RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState


def _trial(tracker: object, number: int, steps: tuple[int, ...]) -> None:
    """Trial ``number``'s run on seed 0: its progress records at ``steps``, then its end."""
    config = TrainConfig(1e-2)
    tracker.on_trial_start(number, config, (0,))  # type: ignore[attr-defined]
    for step in steps:
        tracker.on_trial_result(RunRecord(number, 0, step, RunStatus.RUNNING, loss=1.0 / step))  # type: ignore[attr-defined]
    final = RunRecord(number, 0, steps[-1], RunStatus.SURVIVED, final=True, steps_survived=steps[-1], val_loss=0.5)
    tracker.on_trial_result(final)  # type: ignore[attr-defined]
    tracker.on_trial_complete(TrialOutcome(number, config, TrialState.SURVIVED, (final,), value=0.5))  # type: ignore[attr-defined]


def _tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, study: str) -> tuple[str, Any, Any]:
    """(the store's uri, a ClientProcess of it, a Tracker writing through it) in ``tmp_path``."""
    from tuner.driver.mlflow_process import ClientProcess
    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    process = ClientProcess(uri)
    return uri, process, Tracker(uri, study, {"model": "planted"}, process)


def test_a_killed_child_loses_nothing_and_a_stop_signal_does_not_end_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    uri, process, tracker = _tracked(tmp_path, monkeypatch, "killed")
    first = process.call("search_experiments")  # the child's own answer: it is up
    assert [e.name for e in first if e.name == "killed"] == ["killed"]

    pid = process.pid
    assert pid is not None
    for sig in (signal.SIGINT, signal.SIGHUP):  # a Ctrl-C, a closed terminal: sent to the whole group
        os.kill(pid, sig)
    _trial(tracker, 0, (10, 20, 30))
    assert tracker.flush()
    assert process.pid == pid  # it ignored both: the driver decides when to stop

    os.kill(pid, signal.SIGKILL)  # an OOM kill, say
    assert _gone(pid)
    _trial(tracker, 1, (10, 20))
    # a call the death cuts short fails and stays queued, as for a server that went away; the
    # sender's next send starts another child and sends it again
    assert any(tracker.flush() for _ in range(3))
    assert process.pid not in (None, pid)  # another child
    tracker.close()

    client = MlflowClient(uri)
    runs = {r.data.tags["trial"]: r for r in client.search_runs([tracker.experiment_id]) if "trial" in r.data.tags}
    assert {t: r.info.status for t, r in runs.items()} == {"0": "FINISHED", "1": "FINISHED"}
    assert [m.step for m in client.get_metric_history(runs["1"].info.run_id, "s0/loss")] == [10, 20]
    assert [m.step for m in client.get_metric_history(runs["0"].info.run_id, "s0/loss")] == [10, 20, 30]


def _gone(pid: int, within: float = 30.0) -> bool:
    """Whether process ``pid`` ended (or is a zombie nobody reaped) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while alive([pid]):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_child_ends_with_the_tracker_and_with_a_killed_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, process, tracker = _tracked(tmp_path, monkeypatch, "ends")
    pid = process.pid
    _trial(tracker, 0, (10,))
    tracker.close()
    assert pid is not None and process.pid is None and _gone(pid)  # closed with the tracker, not left behind

    # a driver killed with kill -9 cleans nothing up: its end of the socket closes, and the child exits
    code = ("import os, signal; from tuner.driver.mlflow_process import ClientProcess; "
            f"p = ClientProcess({uri!r}); p.call('search_experiments'); print(p.pid, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    driver = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert driver.returncode == -signal.SIGKILL, driver.stderr
    assert _gone(int(driver.stdout.split()[0]))


def test_the_childs_errors_keep_their_words_and_errno(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sender reads in an error (tuner.driver.mlflow_sender.for_good: a full disk's errno or
    words, else a server away for a while) arrives from the child as it was raised there."""
    import errno

    from tuner.driver.mlflow_process import ClientProcess, RemoteError

    monkeypatch.chdir(tmp_path)
    process = ClientProcess(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        run_id = process.create_run(process.create_experiment("errors")).info.run_id
        with pytest.raises(RemoteError, match="no-such-run"):
            process.get_run("no-such-run")  # the store's own words
        with pytest.raises(OSError) as failed:
            process.log_artifact(run_id, str(tmp_path / "missing.yaml"))
        assert failed.value.errno == errno.ENOENT  # an OSError keeps its errno (ENOSPC: for_good)
        assert process.get_run(run_id).info.run_id == run_id  # the child is still there
    finally:
        process.close()


def test_a_launch_on_a_large_cluster_writes_through_the_process(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.config import LaunchConfig
    from tuner.driver.launch import PROCESS_SLOTS, make_tracker
    from tuner.driver.mlflow_process import ClientProcess
    from tuner.driver.tracking import connect

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    config = LaunchConfig(model="iterated_mlp", tracking_uri=uri, storage=f"sqlite:///{tmp_path / 'o.db'}")
    client = connect(uri)
    small = make_tracker(config, client, "d1", slots=PROCESS_SLOTS - 1)
    large = make_tracker(config, client, "d2", slots=PROCESS_SLOTS)
    assert small is not None and large is not None
    try:
        assert small.client is client  # a small cluster: the thread is cheaper than a second interpreter
        assert isinstance(large.client, ClientProcess)
    finally:
        small.close()
        large.close()
