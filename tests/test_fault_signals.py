"""Stop signals as operators send them, each to a real launch (real Ray, SQLite, MLflow, TensorFlow):
SIGTERM to the driver then SIGKILL 10 s later (Kubernetes, ``docker stop``), SIGTERM to the whole
process group, and SIGHUP from a terminal that really hangs up (a pseudo-terminal whose master
side is closed). Each ends with 128 + the signal and one ``tuner:`` line, leaves nothing RUNNING in
Optuna or MLflow and no process of the launch, and the same command continues the study.

Ctrl-C (SIGINT to the process group) is tests/test_fault_matrix.py's; a second signal during the
cleanup is tests/test_signals.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import FINISHED, NO_VERIFY, ROOT, run_tuner
from tests.test_fault_matrix import _launch_until_one_trial_finished, _running_after_one_finished, _stores

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

ARGS = ["launch", "--trials", "3", "--steps", "1500", "--seeds", "1", "--report-every", "100", *NO_VERIFY]


def _nothing_running(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    """Assert that no trial and no MLflow run of study s1 is RUNNING; return the trials."""
    from mlflow.tracking import MlflowClient

    trials = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}").trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags.get("tuner.role") == "study"][-1:] == ["KILLED"]
    return trials


def _session_gone(sid: int, timeout: float = 30) -> list[str]:
    """The processes still in session ``sid`` after up to ``timeout`` s (none once the launch is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        left = subprocess.run(["ps", "-s", str(sid), "-o", "pid=,args="], capture_output=True,
                              text=True).stdout.splitlines()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_fault_sigterm_then_sigkill_after_10_s_exit_143_and_the_same_command_continues(tmp_path: Path) -> None:
    """Kubernetes' pod stop: SIGTERM to the driver alone, SIGKILL to what is left 10 s later."""
    args = [*ARGS, *_stores(tmp_path)]
    driver, log = _launch_until_one_trial_finished(tmp_path, args, f"sqlite:///{tmp_path / 't.db'}")
    os.kill(driver.pid, signal.SIGTERM)
    try:
        code = driver.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_session(driver.pid)  # what Kubernetes does after the grace period: SIGKILL to every process
    assert code == 143, log.read_text()[-3000:]
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("tuner:")]
    assert len(lines) == 1 and "Traceback" not in text and "SIGTERM received" not in text, text[-3000:]
    assert lines[0].startswith("tuner: stopped by SIGTERM: study 's1' keeps its ")
    stopped = [t for t in _nothing_running(tmp_path) if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all(t.user_attrs["reason"] == "stopped by SIGTERM" for t in stopped)

    again = run_tuner(args, cwd=tmp_path, timeout=400)
    assert again.returncode in FINISHED, again.stdout[-2000:] + again.stderr[-2000:]
    trials = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}").trials
    assert {t.user_attrs.get("rerun_of") for t in trials} - {None} == {t.number for t in stopped}
    assert all(t.state.is_finished() for t in trials)


def test_fault_sigterm_to_the_process_group_exit_143_nothing_running_no_process_left(tmp_path: Path) -> None:
    """``kill -TERM -- -PGID`` (systemd's and Slurm's way): Ray's processes are spared, the driver cleans up."""
    driver, log = _launch_until_one_trial_finished(tmp_path, [*ARGS, *_stores(tmp_path)],
                                                   f"sqlite:///{tmp_path / 't.db'}")
    os.killpg(driver.pid, signal.SIGTERM)
    try:
        assert driver.wait(timeout=60) == 143, log.read_text()[-3000:]
    finally:
        left = _session_gone(driver.pid)
        _kill_session(driver.pid)
    text = log.read_text()
    assert "Traceback" not in text and "SIGTERM received" not in text, text[-3000:]
    assert next(line for line in text.splitlines() if line.startswith("tuner:")).startswith("tuner: stopped by SIGTERM")
    assert not left, left
    _nothing_running(tmp_path)


def _kill_session(sid: int) -> None:
    """SIGKILL every process left in session ``sid`` (the launch's, started with start_new_session)."""
    for line in subprocess.run(["ps", "-s", str(sid), "-o", "pid="], capture_output=True, text=True).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line), signal.SIGKILL)


def _controlling_terminal() -> None:
    """A ``preexec_fn`` (after setsid): standard input, a pseudo-terminal's slave, becomes the
    session's controlling terminal, as a terminal window's shell has it."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_fault_terminal_closed_sighup_exit_129_nothing_running_no_process_left(tmp_path: Path) -> None:
    """The launch runs on a real pseudo-terminal (live view on); the terminal's master side is closed,
    as a closed window or a dropped ssh does: the kernel sends SIGHUP to the launch."""
    master, slave = os.openpty()
    screen: list[bytes] = []
    driver = subprocess.Popen([sys.executable, "-m", "tuner", *ARGS, *_stores(tmp_path)], cwd=tmp_path,
                              stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                              preexec_fn=_controlling_terminal, env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    reader = threading.Thread(target=_drain, args=(master, screen), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while not _running_after_one_finished(f"sqlite:///{tmp_path / 't.db'}"):  # one trial finished, others run
        assert driver.poll() is None and time.monotonic() < deadline, b"".join(screen)[-3000:]
        time.sleep(0.2)
    os.close(master)  # the terminal hangs up
    try:
        assert driver.wait(timeout=60) == 129
    finally:
        left = _session_gone(driver.pid)
        _kill_session(driver.pid)
    assert not left, left
    stopped = [t for t in _nothing_running(tmp_path) if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all(t.user_attrs["reason"] == "stopped by SIGHUP (the terminal closed)" for t in stopped)


def _drain(fd: int, into: list[bytes]) -> None:
    """Read what the launch writes to its terminal until the terminal goes away."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)

